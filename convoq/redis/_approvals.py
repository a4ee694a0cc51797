"""Approvals from outside the runner: deciding a parked turn's pending tool calls
(``decide``), discarding the turn (``discard``), and listing the turns that wait
(``parked_turns``). A parked turn holds its conversation's lease in the "parked" state
until its calls are decided or the approval expires."""

from __future__ import annotations

from typing import Any, Literal

from convoq.redis._base import ProtocolBase
from convoq.redis._cancelling import cancelled_arg, turn_control_keys
from convoq.redis._codec import text
from convoq.redis._records import ParkedTurn, decode_record
from convoq.redis._replies import DiscardReply, Outcome
from convoq.redis._taking import valid_turn_id
from convoq.turn_state import Decision


class ApprovalsMixin(ProtocolBase):
    """``decide``, ``discard``, ``parked_turns``."""

    async def decide(
        self,
        cid: str,
        turn_id: str,
        *,
        call_id: str,
        approved: bool,
        reason: str | None = None,
        by: str | None = None,
    ) -> Literal["resume", "pending"]:
        """Record a decision on a pending tool call of a parked turn, with who decided
        (``by``) and the server time; it is also a "decision" event of the turn. "resume":
        all calls are decided, send a kick for ``cid``. Repeating a decision (same verdict
        and reason) is a no-op.

        Raises:
            UnknownTurnError; ProtocolError when the turn is not awaiting approval, the call
            id is not pending, it was decided otherwise, or the approval expired.
        """
        decision = Decision(approved=approved, reason=reason, by=by)
        raw = decision.model_dump_json(exclude={"at_ms"})
        keys = [self.keys.lease(cid), self.keys.turn(cid, turn_id)]
        keys.append(self.keys.events(cid, turn_id))
        args = [call_id, raw, self.events_maxlen]
        reply = Outcome.parse("decide", await self.scripts.run("decide", keys, args))
        if reply.refusal is not None:
            raise self.refusal(reply.refusal, cid, turn_id)
        return "resume" if reply.status == "RESUME" else "pending"

    async def discard(self, cid: str, turn_id: str, *, reason: str = "discarded") -> bool:
        """End a parked turn as cancelled, storing nothing, and free the conversation.
        Returns True if more turns are queued (send a kick). Repeating it is a no-op."""
        args = [turn_id, cancelled_arg(self, reason), self.turn_ttl_ms, self.events_maxlen]
        keys = turn_control_keys(self, cid, turn_id)
        reply = DiscardReply.parse(await self.scripts.run("discard", keys, args))
        if reply.refusal is not None:
            raise self.refusal(reply.refusal, cid, turn_id)
        return reply.queued > 0

    async def parked_turns(
        self, limit: int = 100, *, offset: int = 0, conversation_prefix: str = ""
    ) -> list[ParkedTurn]:
        """Turns awaiting approval across the conversations whose id starts with
        ``conversation_prefix``, newest first: ``limit`` of them from ``offset``.

        A SCAN over the inboxes (as the sweeper's): its cost grows with the number of
        keys, so callers poll it every few seconds, not per request of a busy path.
        """
        found: list[ParkedTurn] = []
        async for key in self.redis.scan_iter(match=self.keys.inbox_pattern(), count=1000):
            cid = self.keys.conversation_of_inbox(key)
            if cid is None or not cid.startswith(conversation_prefix):
                continue  # filtered before the limit: other conversations take no place
            parked = await self._parked_head(cid)
            if parked is not None:
                found.append(parked)
        found.sort(key=lambda p: p.parked_ms, reverse=True)
        return found[max(0, offset) : max(0, offset) + max(0, limit)]

    async def _parked_head(self, cid: str) -> ParkedTurn | None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hmget(self.keys.lease(cid), "state", "expires_ms")
            pipe.lindex(self.keys.inbox(cid), 0)
            (state, expires_ms), head = await pipe.execute()
        tid = valid_turn_id(head) if state == b"parked" and head is not None else None
        if tid is None:
            return None
        raw: dict[Any, Any] = await self.redis.hgetall(self.keys.turn(cid, tid))
        if not raw or raw.get(b"status") != b"awaiting_approval":
            return None  # decided (or expired) since the lease was read
        fields: dict[str, bytes] = {text(k): v for k, v in raw.items()}
        record = decode_record(cid, tid, fields, self.keys.turn(cid, tid))
        return ParkedTurn(record, int(fields.get("parked_ms") or 0), int(expires_ms or 0))

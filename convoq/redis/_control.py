"""Turn control from outside the runner (approvals, cancel, clear), history reads, the
sweeper's scan, the workers' registry and the dataset epoch: the part of TurnProtocol
that holds no lease."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any, Literal

from convoq._sync import adrive
from convoq.errors import ConversationMemoryError, ConvoqError, TurnCancelledError
from convoq.ids import check_conversation_id, check_turn_id
from convoq.messages import Message
from convoq.redis._base import ProtocolBase
from convoq.redis._budget import budget_steps
from convoq.redis._codec import text
from convoq.redis._counted import counted_steps
from convoq.redis._history import load_history
from convoq.redis._records import ParkedTurn, decode_record
from convoq.redis._taking import valid_turn_id
from convoq.turn_state import Decision
from convoq.window import Window

log = logging.getLogger("convoq.redis")

_CLEAR_RETRIES = 20


class ControlMixin(ProtocolBase):
    """Approvals, cancellation, clear, history, sweeping, registry, epoch."""

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
        reply = await self.scripts.run("decide", keys, [call_id, raw, self.events_maxlen])
        if reply[0] == "RESUME":
            return "resume"
        if reply[0] == "PENDING":
            return "pending"
        raise self.refusal(reply, cid, turn_id)

    def _turn_control_keys(self, cid: str, turn_id: str) -> list[str]:
        return [self.keys.inbox(cid), self.keys.lease(cid), *self.keys.turn_keys(cid, turn_id)]

    def _cancelled(self, reason: str) -> str:
        error = TurnCancelledError(f"the turn was cancelled: {reason}", reason=reason)
        return self.json_arg(error.to_data(), "error")

    async def discard(self, cid: str, turn_id: str, *, reason: str = "discarded") -> bool:
        """End a parked turn as cancelled, storing nothing, and free the conversation.
        Returns True if more turns are queued (send a kick). Repeating it is a no-op."""
        args = [turn_id, self._cancelled(reason), self.turn_ttl_ms, self.events_maxlen]
        reply = await self.scripts.run("discard", self._turn_control_keys(cid, turn_id), args)
        if reply[0] == "OK" or (reply[0] == "FINISHED" and reply[1] == b"cancelled"):
            return int(reply[-1]) > 0
        if reply[0] == "FINISHED":
            reply = ["APPLIED"]
        raise self.refusal(reply, cid, turn_id)

    async def cancel(self, cid: str, turn_id: str) -> Literal["cancelled", "stopping", "finished"]:
        """Cancel a turn: queued or parked -> "cancelled" at once; running -> "stopping"
        (its runner's next renewal or checkpoint reports it, and it fails the turn as
        cancelled); already ended -> "finished"."""
        args = [turn_id, self._cancelled("cancelled by request"), self.turn_ttl_ms]
        reply = await self.scripts.run(
            "cancel", self._turn_control_keys(cid, turn_id), [*args, self.events_maxlen]
        )
        outcomes: dict[str, Literal["cancelled", "stopping", "finished"]] = {
            "CANCELLED": "cancelled",
            "STOPPING": "stopping",
            "FINISHED": "finished",
        }
        if reply[0] in outcomes:
            return outcomes[reply[0]]
        raise self.refusal(reply, cid, turn_id)

    async def is_cancel_requested(self, cid: str, turn_id: str) -> bool:
        return await self.redis.hget(self.keys.turn(cid, turn_id), "cancel") == b"1"

    async def clear(self, cid: str, *, force: bool = False) -> None:
        """Delete every key of the conversation. ConversationBusyError while turns are
        queued, running or parked, unless ``force`` (their records go too)."""
        fixed = [*self.keys.history_keys(cid), self.keys.inbox(cid), self.keys.lease(cid)]
        for _ in range(_CLEAR_RETRIES):
            queued = [check_turn_id(text(t)) for t in await self.redis.lrange(fixed[4], 0, -1)]
            found = {
                text(k)
                async for k in self.redis.scan_iter(
                    match=self.keys.conversation_pattern(cid), count=1000
                )
            }
            for tid in queued:
                found.update(self.keys.turn_keys(cid, tid))
            others = sorted(found.difference(fixed))
            args = ["1" if force else "0", *queued]
            reply = await self.scripts.run("clear", [*fixed, *others], args)
            if reply[0] == "OK":
                return
            if reply[0] != "RETRY":
                raise self.refusal(reply, cid, None)
        raise ConversationMemoryError(
            f"conversation {cid!r} kept changing while it was cleared; try again"
        )

    async def history(self, cid: str, *, last_turns: int | None = None) -> list[Message]:
        """Stored messages: the leading system/developer ones plus the last N turns."""
        check_conversation_id(cid)
        if last_turns is not None and last_turns < 0:
            raise ConvoqError("last_turns must be >= 0 (0 or None loads the whole history)")
        return await load_history(self.scripts, self.keys, cid, last_turns)

    async def window(self, cid: str, window: Window) -> list[Message]:
        """The stored messages ``window`` sends. A token budget with the default counter
        is chosen from the counts stored with each turn, reading only the window; another
        counter counts the turns read from the newest back until the budget is spent (or,
        ``with_summary``, the summary's watermark is reached)."""
        check_conversation_id(cid)
        if window.max_tokens is not None and not window.default_counter:
            counted = counted_steps(self.keys, cid, window)  # a counter of the caller's own
            return window.apply(await adrive(counted, self.scripts.perform))
        if window.max_tokens is not None or window.with_summary:
            keep = window.keep_last_turns or 0
            steps = budget_steps(self.keys, cid, window.max_tokens, keep, window.with_summary)
            return window.apply(await adrive(steps, self.scripts.perform))
        # Exactly the window already: the last N whole turns, nothing to trim.
        return await load_history(self.scripts, self.keys, cid, window.keep_last_turns)

    async def sweep_candidates(self) -> list[str]:
        """Conversations with queued turns and no live lease: kick them. A parked turn
        whose approval expired is among them (its parked lease is gone): the acquire that
        follows records its undecided calls as expired and runs it to its end."""
        found: list[str] = []
        async for key in self.redis.scan_iter(match=self.keys.inbox_pattern(), count=1000):
            cid = self.keys.conversation_of_inbox(key)
            if cid is None or await self.redis.exists(self.keys.lease(cid)):
                continue
            if await self._valid_head(cid):
                found.append(cid)
        return found

    async def _valid_head(self, cid: str) -> bool:
        """The inbox has a head, and it is a turn id."""
        head = await self.redis.lindex(self.keys.inbox(cid), 0)
        if head is None:
            return False
        if valid_turn_id(head) is None:
            # One damaged inbox must not stop the sweep of every other conversation.
            log.error("the inbox of conversation %r holds %r, not a turn id: skipped", cid, head)
            return False
        return True

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

    async def registered_agents(self) -> frozenset[str]:
        """The agent profile names running workers registered."""
        return frozenset(text(n) for n in await self.redis.smembers(self.keys.agents()))

    async def registered_workers(self) -> dict[str, dict[str, Any]]:
        """Running workers as they registered: name -> pid, queues, agents, started_ms,
        seen_ms (refreshed every sweep period, so a stale entry is a dead worker)."""
        entries = await self.redis.hgetall(self.keys.workers())
        return {text(name): json.loads(info) for name, info in entries.items()}

    async def registered_prefixes(self) -> frozenset[str]:
        """The prefixes any worker on this Redis has registered under."""
        return frozenset(text(n) for n in await self.redis.smembers(self.keys.prefixes()))

    async def check_epoch(self, expected: str | None) -> str:
        """The dataset's epoch marker, created if absent. Workers call it with None at start
        and then with the value they got: a different value means Redis came back empty
        or another dataset is behind the URL, and ConversationMemoryError is raised."""
        key = self.keys.epoch()
        await self.redis.set(key, uuid.uuid4().hex, nx=True)
        current = text(await self.redis.get(key) or b"")
        if expected is not None and current != expected:
            raise ConversationMemoryError(
                f"the Redis dataset changed (epoch {expected} is now {current}): it was emptied"
                " or replaced; check Redis persistence (AOF) before serving again",
                expected=expected,
                found=current,
            )
        return current

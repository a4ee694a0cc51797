"""Approvals from outside the runner: deciding a parked turn's pending tool calls
(``decide``), discarding the turn (``discard``), and listing the turns that wait
(``parked_turns``). A parked turn holds its conversation's lease in the "parked" state
until its calls are decided or the approval expires."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import Any, Literal

from convoq.errors import CorruptDataError
from convoq.redis._base import ProtocolBase
from convoq.redis._cancelling import cancelled_arg, turn_control_keys
from convoq.redis._codec import parse_header, text
from convoq.redis._records import (
    AttachmentNote,
    ParkedTurn,
    RecentMessage,
    TurnRecord,
    decode_record,
)
from convoq.redis._replies import DecideReply, DiscardReply
from convoq.redis._taking import valid_turn_id
from convoq.turn_state import Decision

log = logging.getLogger("convoq.redis")


@dataclass(frozen=True)
class Decided:
    """What deciding a call came to: ``outcome`` "resume" (every call of the turn is
    decided) or "pending"; ``repeated``: the same decision was recorded before, so
    nothing was written now and no resume is owed for it. ``agent``: with "resume", the
    agent the turn's record names (None: none), whose pool its resume kick goes to."""

    outcome: Literal["resume", "pending"]
    repeated: bool = False
    agent: str | None = None


class ApprovalsMixin(ProtocolBase):
    """``decide`` (``record_decision``), ``discard`` (``discard_turn``), ``parked_turns``."""

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
        and reason) writes nothing; :meth:`record_decision` says whether it was a repeat.

        Raises:
            UnknownTurnError; ProtocolError when the turn is not awaiting approval, the call
            id is not pending, it was decided otherwise, or the approval expired.
        """
        decided = await self.record_decision(
            cid, turn_id, call_id=call_id, approved=approved, reason=reason, by=by
        )
        return decided.outcome

    async def record_decision(
        self,
        cid: str,
        turn_id: str,
        *,
        call_id: str,
        approved: bool,
        reason: str | None = None,
        by: str | None = None,
        kind: Literal["person", "child", "result"] = "person",
        result: str | None = None,
        is_error: bool = False,
    ) -> Decided:
        """:meth:`decide`, saying also whether the same decision was recorded before (a
        retry: the first is kept, nothing is written, the resume was owed by the first).
        ``kind`` "child": the call's child turn ended (a sub-agent call is decided so, and
        only so); "result": a deferred call's ``result`` arrived (JSON text, or with
        ``is_error`` the error the model reads), and only so is it decided."""
        decision = Decision(
            approved=approved, reason=reason, by=by, result=result, is_error=is_error
        )
        raw = decision.model_dump_json(exclude={"at_ms"})
        keys = [self.keys.lease(cid), self.keys.turn(cid, turn_id)]
        keys.append(self.keys.events(cid, turn_id))
        args = [call_id, raw, self.events_maxlen, kind]
        reply = DecideReply.parse(await self.scripts.run("decide", keys, args))
        if reply.refusal is not None:
            raise self.refusal(reply.refusal, cid, turn_id)
        repeated = reply.status.startswith("KEPT_")
        resume = reply.status in ("RESUME", "KEPT_RESUME")
        return Decided("resume" if resume else "pending", repeated=repeated, agent=reply.agent)

    async def discard(self, cid: str, turn_id: str, *, reason: str = "discarded") -> bool:
        """End a parked turn as cancelled, storing nothing, and free the conversation.
        Returns True if more turns are queued (send a kick). Repeating it is a no-op."""
        return await self.discard_turn(cid, turn_id, reason=reason) is not None

    async def discard_turn(
        self, cid: str, turn_id: str, *, reason: str = "discarded"
    ) -> str | None:
        """:meth:`discard`, answering the turn first in the conversation's line after it,
        read in the same call (the one to kick), or None when no turn is queued."""
        args = [turn_id, cancelled_arg(self, reason), self.turn_ttl_ms, self.events_maxlen]
        keys = turn_control_keys(self, cid, turn_id)
        reply = DiscardReply.parse(await self.scripts.run("discard", keys, args))
        if reply.refusal is not None:
            raise self.refusal(reply.refusal, cid, turn_id)
        return reply.head

    async def parked_turns(
        self, limit: int = 100, *, offset: int = 0, conversation_prefix: str = ""
    ) -> list[ParkedTurn]:
        """Turns awaiting approval across the conversations whose id starts with
        ``conversation_prefix``, newest first: ``limit`` of them from ``offset``. Each
        comes with the messages of its conversation's last few stored turns
        (:func:`recent_messages`: bounded text, attachments by name and type only).

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
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.keys.turn(cid, tid))
            pipe.lrange(self.keys.turns(cid), -RECENT_ELEMENTS, -1)
            raw, elements = await pipe.execute()
        if not raw or raw.get(b"status") != b"awaiting_approval":
            return None  # decided (or expired) since the lease was read
        fields: dict[str, bytes] = {text(k): v for k, v in raw.items()}
        record = for_a_person(decode_record(cid, tid, fields, self.keys.turn(cid, tid)))
        recent = recent_messages(elements, self.keys.turns(cid))
        return ParkedTurn(record, int(fields.get("parked_ms") or 0), int(expires_ms or 0), recent)


def for_a_person(record: TurnRecord) -> TurnRecord:
    """``record`` with only the pending calls a person decides: a call that waits for
    the world (a result, a signal) or a child turn is decided by that alone, so the
    approvals inbox offers no approve or deny for it."""
    result = dict(record.result or {})
    waits = result.get("waits") or {}
    calls = result.get("pending_approvals") or []
    result["pending_approvals"] = [c for c in calls if c.get("id") not in waits]
    return replace(record, result=result)


RECENT_ELEMENTS = 6
"""Stored elements (a turn each, mostly) read to show the conversation before a parked turn."""

RECENT_TURNS = 3
"""Of those, the turns whose messages are shown."""

MAX_RECENT_TEXT = 1000
"""Characters of a message's text shown; the rest is cut, marked with an ellipsis."""


def recent_messages(elements: list[bytes], key: str) -> tuple[RecentMessage, ...]:
    """The messages of the last RECENT_TURNS turns among stored ``elements``, for a person
    to read: text cut at MAX_RECENT_TEXT characters, attachments by name and type only
    (their bytes are never read). Elements that do not parse are left out (logged): the
    turn still waits for a decision, and the inbox still shows it."""
    turns: list[list[RecentMessage]] = []
    for element in elements:
        try:
            header = parse_header(element, key=key)
            raw_messages = json.loads(bytes(header.body))
            shown = [_recent(raw) for raw in raw_messages]
        except (CorruptDataError, ValueError, TypeError, AttributeError) as exc:
            log.warning("a stored element of %s does not parse (%r): not shown", key, exc)
            continue
        if header.starts_turn or not turns:
            turns.append([])
        turns[-1].extend(shown)
    return tuple(m for turn in turns[-RECENT_TURNS:] for m in turn)


def _recent(raw: dict[str, Any]) -> RecentMessage:
    parts = raw.get("content") or []
    said = "".join(str(p.get("text", "")) for p in parts if p.get("type") == "text")
    if len(said) > MAX_RECENT_TEXT:
        said = said[:MAX_RECENT_TEXT] + "…"
    notes = tuple(
        AttachmentNote(str(p["type"]), str(p.get("mime_type", "")), p.get("filename"))
        for p in parts
        if p.get("type") in ("image", "file")
    )
    calls = tuple(str(c.get("name", "")) for c in raw.get("tool_calls") or [])
    return RecentMessage(str(raw.get("role", "")), said, notes, calls)

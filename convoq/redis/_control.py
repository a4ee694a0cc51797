"""Turn control from outside the runner (approvals, cancel, clear), reads, events, the
sweeper's scan, the workers' registry and the dataset epoch: the half of TurnProtocol
that holds no lease."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal, cast, get_args

from convoq.engine import Decision, TurnEvent
from convoq.errors import (
    ConversationMemoryError,
    CorruptDataError,
    TurnCancelledError,
    UnknownTurnError,
)
from convoq.ids import check_conversation_id, check_turn_id
from convoq.messages import Message
from convoq.redis._base import ProtocolBase, approval_expired_error, text
from convoq.redis._history import load_history
from convoq.redis._records import TurnRecord, TurnStatus, decode_record

_CLEAR_RETRIES = 20
# The fields of a turn record that change once it was submitted.
_LIVE_FIELDS = ("status", "result", "error", "attempts", "started_ms", "finished_ms")
log = logging.getLogger("convoq.redis")


class ControlMixin(ProtocolBase):
    """Approvals, cancellation, clear, reads, events, sweeping."""

    async def decide(
        self, cid: str, turn_id: str, *, call_id: str, approved: bool, reason: str | None = None
    ) -> Literal["resume", "pending"]:
        """Record a decision on a pending tool call of a parked turn. "resume": all calls are
        decided, send a kick for ``cid``. A repeated identical decision is a no-op.

        Raises:
            UnknownTurnError; ProtocolError when the turn is not awaiting approval, the call
            id is not pending, it was decided otherwise, or the approval expired.
        """
        decision = Decision(approved=approved, reason=reason).model_dump_json()
        keys = [self.keys.lease(cid), self.keys.turn(cid, turn_id)]
        reply = await self.scripts.run("decide", keys, [call_id, decision])
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
        args = [turn_id, self._cancelled(reason), self.turn_ttl_ms, self.events_maxlen, ""]
        reply = await self.scripts.run("discard", self._turn_control_keys(cid, turn_id), args)
        if reply[0] == "OK" or (reply[0] == "FINISHED" and reply[1] == b"cancelled"):
            return int(reply[-1]) > 0
        if reply[0] == "FINISHED":
            reply = ["APPLIED"]
        raise self.refusal(reply, cid, turn_id)

    async def cancel(self, cid: str, turn_id: str) -> Literal["cancelled", "stopping", "finished"]:
        """Cancel a turn: queued or parked -> "cancelled" at once; running -> "stopping"
        (its runner sees :meth:`is_cancel_requested` and fails it as cancelled);
        already ended -> "finished"."""
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
                raise self.refusal(reply, cid, "?")
        raise ConversationMemoryError(
            f"conversation {cid!r} kept changing while it was cleared; try again"
        )

    async def get_turn(self, cid: str, turn_id: str) -> TurnRecord:
        """The turn's record; UnknownTurnError if there is none (or it expired)."""
        return self._record(cid, turn_id, await self.redis.hgetall(self.keys.turn(cid, turn_id)))

    async def get_turn_and_last_event(self, cid: str, turn_id: str) -> tuple[TurnRecord, str]:
        """The turn's record and the stream id of its latest event ("0" when there is
        none), read together: whatever happens to the turn after this is an event after
        that id. UnknownTurnError as :meth:`get_turn`."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xrevrange(self.keys.events(cid, turn_id), count=1)
            pipe.hgetall(self.keys.turn(cid, turn_id))
            last, raw = await pipe.execute()
        return self._record(cid, turn_id, raw), text(last[0][0]) if last else "0"

    async def read_events_and_turn(
        self, record: TurnRecord, *, after: str, block_ms: int, count: int = 100
    ) -> tuple[list[tuple[str, TurnEvent]], TurnRecord]:
        """:meth:`read_events`, and ``record`` brought up to date in the same round trip
        (its status, result, error, attempts and times are read after the events: never
        older than them). UnknownTurnError if the record is gone."""
        cid, turn_id = record.conversation_id, record.turn_id
        key = self.keys.turn(cid, turn_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            block = block_ms if block_ms > 0 else None
            pipe.xread({self.keys.events(cid, turn_id): after}, count=count, block=block)
            pipe.hmget(key, _LIVE_FIELDS)
            reply, live = await pipe.execute()
        if live[0] is None:
            raise _unknown_turn(cid, turn_id)
        return _events(reply), _refreshed(record, dict(zip(_LIVE_FIELDS, live, strict=True)), key)

    def _record(self, cid: str, turn_id: str, raw: dict[Any, Any]) -> TurnRecord:
        fields = {text(k): v for k, v in raw.items()}
        if not fields:
            raise _unknown_turn(cid, turn_id)
        return decode_record(cid, turn_id, fields, self.keys.turn(cid, turn_id))

    async def history(self, cid: str, *, last_turns: int | None = None) -> list[Message]:
        """Stored messages: the leading system/developer ones plus the last N turns."""
        check_conversation_id(cid)
        if last_turns is not None and last_turns < 0:
            raise ValueError("last_turns must be >= 0")
        return await load_history(self.scripts, self.keys, cid, last_turns)

    async def emit(self, cid: str, turn_id: str, event: TurnEvent) -> None:
        """Append an event to the turn's stream (capped, expires with the turn)."""
        await self.emit_many(cid, turn_id, [event])

    async def emit_many(self, cid: str, turn_id: str, events: Sequence[TurnEvent]) -> None:
        """Append events to the turn's stream in order, in one round trip."""
        key = self.keys.events(cid, turn_id)
        datas = [self.json_arg(event.data, "event data") for event in events]
        async with self.redis.pipeline(transaction=False) as pipe:
            for event, data in zip(events, datas, strict=True):
                pipe.xadd(key, {"type": event.type, "data": data}, maxlen=self.events_maxlen)
            pipe.pexpire(key, self.turn_ttl_ms)
            await pipe.execute()

    async def read_events(
        self, cid: str, turn_id: str, *, after: str = "0", block_ms: int = 0, count: int = 100
    ) -> list[tuple[str, TurnEvent]]:
        """Events after stream id ``after`` ("0": from the start); waits up to ``block_ms``
        for the first one (0: no waiting)."""
        key = self.keys.events(cid, turn_id)
        block = block_ms if block_ms > 0 else None
        return _events(await self.redis.xread({key: after}, count=count, block=block))

    async def sweep_candidates(
        self, *, approval_expiry: bool = True, expired: list[tuple[str, str]] | None = None
    ) -> list[str]:
        """Conversations with queued turns and no live lease (kick them). Parked turns whose
        approval expired are failed first (with ``approval_expiry``); their ``(cid, tid)``
        are appended to ``expired`` (finished turns whose callbacks are owed)."""
        found: list[str] = []
        async for key in self.redis.scan_iter(match=self.keys.inbox_pattern(), count=1000):
            cid = self.keys.conversation_of_inbox(key)
            if cid is None or await self.redis.exists(self.keys.lease(cid)):
                continue
            if approval_expiry and not await self._expire_parked_head(cid, expired):
                continue
            found.append(cid)
        return found

    async def _expire_parked_head(self, cid: str, expired: list[tuple[str, str]] | None) -> bool:
        """Fail the head if its approval expired; True if turns remain queued."""
        head = await self.redis.lindex(self.keys.inbox(cid), 0)
        if head is None:
            return False
        tid = check_turn_id(text(head))
        error = self.json_arg(approval_expired_error(), "error")
        args = [tid, error, self.turn_ttl_ms, self.events_maxlen, "expire"]
        reply = await self.scripts.run("discard", self._turn_control_keys(cid, tid), args)
        if reply[0] != "OK":
            return True
        if expired is not None:
            expired.append((cid, tid))
        return int(reply[1]) > 0

    async def registered_agents(self) -> frozenset[str]:
        """The agent profile names running workers registered."""
        return frozenset(text(n) for n in await self.redis.smembers(self.keys.agents()))

    async def registered_workers(self) -> dict[str, dict[str, Any]]:
        """Running workers as they registered: name -> pid, queues, agents, started_ms,
        seen_ms (refreshed every sweep period, so a stale entry is a dead worker)."""
        entries = await self.redis.hgetall(self.keys.workers())
        return {text(name): json.loads(info) for name, info in entries.items()}

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


def _unknown_turn(cid: str, turn_id: str) -> UnknownTurnError:
    return UnknownTurnError(
        f"no turn {turn_id!r} in conversation {cid!r}: it never existed or its record expired",
        conversation_id=cid,
        turn_id=turn_id,
    )


def _refreshed(record: TurnRecord, live: dict[str, bytes | None], key: str) -> TurnRecord:
    """``record`` with its live fields as read now; CorruptDataError naming ``key``."""

    def number(name: str) -> int | None:
        value = live[name]
        return int(value) if value not in (None, b"") else None

    try:
        status = text(live["status"] or b"")
        if status not in get_args(TurnStatus):
            raise ValueError(f"unknown status {status!r}")
        return dataclasses.replace(
            record,
            status=cast(TurnStatus, status),
            result=json.loads(live["result"]) if live["result"] is not None else None,
            error=json.loads(live["error"]) if live["error"] is not None else None,
            attempts=number("attempts") or 0,
            started_ms=number("started_ms"),
            finished_ms=number("finished_ms"),
        )
    except (ValueError, TypeError) as exc:
        raise CorruptDataError(
            f"the turn record {key} does not parse ({type(exc).__name__}: {exc}"[:300]
            + "); cancel the turn or clear the conversation",
            key=key,
        ) from exc


def _events(reply: Any) -> list[tuple[str, TurnEvent]]:
    """``(stream id, event)`` pairs of an XREAD reply."""
    events: list[tuple[str, TurnEvent]] = []
    for _stream, entries in reply or []:
        for entry_id, fields in entries:
            data = json.loads(fields.get(b"data", b"{}"))
            events.append((entry_id.decode(), TurnEvent(type=fields[b"type"].decode(), data=data)))
    return events


class TurnEvents:
    """The events of one running turn on their way to its stream, in the order added.

    :meth:`add` only buffers. What is buffered goes out with the turn's next fenced write
    (the runner hands :meth:`pending` to checkpoint, commit, fail or park, which append
    the events before their own, so "done" still comes last: one round trip for both), or
    on its own ``flush_after_s`` after it was buffered when no such write comes first (a
    model streaming for seconds still shows its text as it comes). One write at a time,
    so the stream keeps the order of :meth:`add`.
    """

    def __init__(
        self,
        protocol: ControlMixin,
        cid: str,
        turn_id: str,
        *,
        flush_after_s: float = 0.01,
        max_buffered: int = 64,
    ) -> None:
        self._protocol, self._cid, self._tid = protocol, cid, turn_id
        self._delay, self._max = flush_after_s, max_buffered
        self._buffer: list[TurnEvent] = []
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task[None] | None = None

    async def add(self, event: TurnEvent) -> None:
        """Buffer ``event`` (ConvoqError at once if its data is not JSON-safe)."""
        self._protocol.json_arg(event.data, "event data")
        self._buffer.append(event)
        if len(self._buffer) >= self._max:
            await self.flush()
        elif self._timer is None or self._timer.done():
            self._timer = asyncio.create_task(self._flush_later())

    async def flush(self) -> None:
        """Append what is buffered now to the stream."""
        async with self._lock:
            batch = self._buffer[:]
            if batch:
                await self._protocol.emit_many(self._cid, self._tid, batch)
                del self._buffer[: len(batch)]

    @contextlib.asynccontextmanager
    async def pending(self) -> AsyncIterator[list[TurnEvent]]:
        """The buffered events, for a fenced write to send along. They leave the buffer
        when the block ends without an error (kept for the next write otherwise)."""
        async with self._lock:
            batch = self._buffer[:]
            yield batch
            del self._buffer[: len(batch)]

    async def close(self) -> None:
        """Stop a pending flush. Events still buffered are dropped: the turn was abandoned
        (its lease moved on, or Redis is gone) and its next run writes its own."""
        if self._timer is not None and not self._timer.done():
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
        self._buffer.clear()

    async def _flush_later(self) -> None:
        """Flush ``flush_after_s`` after an event was buffered, again while more came in
        meanwhile; stop once the buffer is empty (a fenced write may have emptied it)."""
        while self._buffer:
            await asyncio.sleep(self._delay)
            try:
                await self.flush()
            except Exception as exc:  # they stay buffered and go with the turn's next write
                log.warning("events of turn %s/%s not sent yet: %s", self._cid, self._tid, exc)
                return

"""Turn records and their event streams: the reads that follow a turn (records, events,
both in one round trip) and the writes of events, including :class:`TurnEvents`, the buffer
that sends a running turn's events along with its fenced writes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast, get_args

from pydantic import ValidationError
from redis.exceptions import ResponseError

from convoq import defaults
from convoq.errors import CorruptDataError, UnknownTurnError
from convoq.redis._base import ProtocolBase
from convoq.redis._codec import text
from convoq.redis._records import TurnRecord, TurnStatus, decode_record, with_stored_decisions
from convoq.redis.roles import EventSink
from convoq.turn_state import TurnEvent

# How long a live reader counts as there after its read's block time ran out (it reads
# again at once; this covers its handling of the events between two reads).
_READER_GRACE_MS = 2000
# The fields of a turn record that change once it was submitted.
_LIVE_FIELDS = ("status", "result", "error", "attempts", "started_ms", "finished_ms")
log = logging.getLogger("convoq.redis")


class EventsMixin(ProtocolBase):
    """Turn records and event streams."""

    async def get_turn(self, cid: str, turn_id: str) -> TurnRecord:
        """The turn's record; UnknownTurnError if there is none (or it expired)."""
        return self._record(cid, turn_id, await self.redis.hgetall(self.keys.turn(cid, turn_id)))

    async def get_turn_and_last_event(self, cid: str, turn_id: str) -> tuple[TurnRecord, str]:
        """The turn's record and the stream id of its latest event ("0" when there is
        none), in one round trip: whatever happens to the turn after this is an event after
        that id. UnknownTurnError as :meth:`get_turn`."""
        # No MULTI needed (two commands less): the id is read first, so a change between
        # the two reads is in the record and also an event after the id, seen again.
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xrevrange(self.keys.events(cid, turn_id), count=1)
            pipe.hgetall(self.keys.turn(cid, turn_id))
            last, raw = await pipe.execute()
        return self._record(cid, turn_id, raw), text(last[0][0]) if last else "0"

    async def read_events_and_turn(
        self, record: TurnRecord, *, after: str, block_ms: int, count: int = 100
    ) -> tuple[list[tuple[str, TurnEvent]], TurnRecord]:
        """:meth:`read_events`, and ``record`` brought up to date (its status, result,
        error, attempts and times, never older than the events): from the entry that ended
        the turn, which carries them (commit's), else read after the events when they
        change the status to one a waiter stops at, or none came. UnknownTurnError if the
        record is gone."""
        cid, turn_id = record.conversation_id, record.turn_id
        key, stream = self.keys.turn(cid, turn_id), self.keys.events(cid, turn_id)
        block = block_ms if block_ms > 0 else None
        # Sent directly where it can be (a waiter wakes up at least twice a turn).
        blocking = ("BLOCK", block) if block is not None else ()
        xread = ("XREAD", "COUNT", count, *blocking, "STREAMS", stream, after)
        replies = await self.scripts.direct([xread])
        if replies is not None:
            if isinstance(replies[0], ResponseError):
                raise replies[0]
            reply = replies[0]
        else:
            # A pipeline, as the reads below: on a cluster it rides out a node's failover.
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xread({stream: after}, count=count, block=block)
                (reply,) = await pipe.execute()
        events, live = read_entries(reply, after)
        record = _handed(record, events)
        if live is not None:
            return events, _refreshed(record, live, key)
        if events and _status_reached(events) is None:
            # News, but none a waiter stops at: the record's status as the events say.
            started = any(
                e.type == "status" and e.data.get("status") == "running" for _, e in events
            )
            return events, dataclasses.replace(record, status="running") if started else record
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hmget(key, _LIVE_FIELDS)
            (fields,) = await pipe.execute()
        if fields[0] is None:
            raise _unknown_turn(cid, turn_id)
        live = {
            name: _decoded(name, value) for name, value in zip(_LIVE_FIELDS, fields, strict=True)
        }
        return events, _refreshed(record, live, key)

    def _record(self, cid: str, turn_id: str, raw: dict[Any, Any]) -> TurnRecord:
        fields = {text(k): v for k, v in raw.items()}
        if not fields:
            raise _unknown_turn(cid, turn_id)
        return decode_record(cid, turn_id, fields, self.keys.turn(cid, turn_id))

    async def emit(self, cid: str, turn_id: str, event: TurnEvent) -> None:
        """Append an event to the turn's stream (capped, expires with the turn)."""
        await self.emit_many(cid, turn_id, [event])

    async def emit_many(self, cid: str, turn_id: str, events: Sequence[TurnEvent]) -> bool:
        """Append events to the turn's stream in order, in one round trip. Returns whether
        someone reads the stream live (see :meth:`read_events`)."""
        key = self.keys.events(cid, turn_id)
        datas = [self.json_arg(event.data, "event data") for event in events]
        async with self.redis.pipeline(transaction=False) as pipe:
            for event, data in zip(events, datas, strict=True):
                pipe.xadd(key, {"type": event.type, "data": data}, maxlen=self.events_maxlen)
            pipe.pexpire(key, self.turn_ttl_ms)
            pipe.exists(self.keys.reader(cid, turn_id))
            replies = await pipe.execute()
        return bool(replies[-1])

    async def read_events(
        self,
        cid: str,
        turn_id: str,
        *,
        after: str = "0",
        block_ms: int = 0,
        count: int = 100,
        live: bool = False,
    ) -> list[tuple[str, TurnEvent]]:
        """Events after stream id ``after`` ("0": from the start); waits up to ``block_ms``
        for the first one (0: no waiting). ``live``: the caller follows the stream as it
        comes; while such a reader is there, the worker keeps each chunk of streamed text
        it writes as its own event (otherwise it joins those of one write into one; see
        :class:`TurnEvents`)."""
        key = self.keys.events(cid, turn_id)
        block = block_ms if block_ms > 0 else None
        if not live:
            return _events(await self.redis.xread({key: after}, count=count, block=block), after)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.reader(cid, turn_id), b"1", px=block_ms + _READER_GRACE_MS)
            pipe.xread({key: after}, count=count, block=block)
            _, reply = await pipe.execute()
        return _events(reply, after)


def _unknown_turn(cid: str, turn_id: str) -> UnknownTurnError:
    return UnknownTurnError(
        f"no turn {turn_id!r} in conversation {cid!r}: it never existed or its record expired",
        conversation_id=cid,
        turn_id=turn_id,
    )


def _decoded(name: str, value: Any) -> Any:
    """A live field as HMGET read it: text, but result and error left as JSON bytes for
    :func:`_refreshed` (where a value that does not parse is a CorruptDataError)."""
    if value is None or name in ("result", "error"):
        return value
    return text(value)


def _status_reached(events: Sequence[tuple[str, TurnEvent]]) -> str | None:
    """The last status among ``events`` a waiter may stop at (final, parked), or None."""
    reached = None
    for _, event in events:
        status = event.data.get("status") if event.type in ("status", "done") else None
        if isinstance(status, str) and status not in ("queued", "running"):
            reached = status
    return reached


def _refreshed(record: TurnRecord, live: dict[str, Any], key: str) -> TurnRecord:
    """``record`` with its live fields as read now (what an ending entry carries, or
    :func:`_decoded` HMGET replies); CorruptDataError naming ``key``."""

    def number(name: str) -> int | None:
        value = live.get(name)
        return int(value) if value not in (None, "") else None

    try:
        status = str(live.get("status") or "")
        if status not in get_args(TurnStatus):
            raise ValueError(f"unknown status {status!r}")
        result, error = (
            json.loads(v) if isinstance(v, bytes) else v
            for v in (live.get("result"), live.get("error"))
        )
        return dataclasses.replace(
            record,
            status=cast(TurnStatus, status),
            result=result,
            decisions=with_stored_decisions(record.decisions, result),
            error=error,
            attempts=number("attempts") or 0,
            started_ms=number("started_ms"),
            finished_ms=number("finished_ms"),
        )
    except (ValueError, TypeError, ValidationError) as exc:
        raise CorruptDataError(
            f"the turn record {key} does not parse ({type(exc).__name__}: {exc}"[:300]
            + "); cancel the turn or clear the conversation",
            key=key,
        ) from exc


def _id_key(event_id: str) -> tuple[int, int] | None:
    """A stream id as numbers to compare ("ms" alone: ms-0, as XREAD reads it), or None."""
    ms, _, seq = event_id.partition("-")
    if not ms.isdigit() or not (seq.isdigit() or seq == ""):
        return None
    return int(ms), int(seq or 0)


def read_entries(reply: Any, after: str = "0") -> tuple[list[tuple[str, TurnEvent]], Any]:
    """``(event id, event)`` pairs of an XREAD reply, after event id ``after``, and the
    turn's live fields an ending entry carried (the last one's; None when none did).

    An entry is one event (fields ``type`` and ``data``; its id is the event's) or several
    (``events``: a JSON array of ``{"type", "data"}``), stored under the id of the last
    one: with n events in entry ms-s they are ms-(s-n+1) .. ms-s (the writer reserved
    those ids, see emit_events() in lua/_lib.lua). A reader resuming from one of them gets
    that entry again and skips the events up to it. The reply is redis-py's (each entry's
    fields as a dict) or the raw one (fields as a flat list; streams as a list of pairs in
    RESP2, a map in RESP3)."""
    events: list[tuple[str, TurnEvent]] = []
    live = None
    floor = _id_key(after)
    streams = reply.items() if isinstance(reply, dict) else reply or []
    for _stream, entries in streams:
        for entry_id, raw_fields in entries:
            fields = raw_fields if isinstance(raw_fields, dict) else _pairs(raw_fields)
            eid = text(entry_id)
            batch = fields.get(b"events")
            if batch is None:
                data = json.loads(fields.get(b"data", b"{}"))
                events.append((eid, TurnEvent(type=text(fields[b"type"]), data=data)))
            else:
                items = json.loads(batch)
                ms, _, seq = eid.partition("-")
                first = int(seq) - len(items) + 1
                for i, item in enumerate(items):
                    if floor is None or (int(ms), first + i) > floor:
                        event = TurnEvent(type=item["type"], data=item["data"])
                        events.append((f"{ms}-{first + i}", event))
            if b"turn" in fields:
                live = json.loads(fields[b"turn"])
    return events, live


def _events(reply: Any, after: str = "0") -> list[tuple[str, TurnEvent]]:
    """The events of an XREAD reply after event id ``after`` (see :func:`read_entries`)."""
    return read_entries(reply, after)[0]


def _pairs(flat: list[Any]) -> dict[Any, Any]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def join_text_deltas(events: Sequence[TurnEvent]) -> list[TurnEvent]:
    """``events`` with each run of consecutive ``text_delta`` events joined into one."""
    out: list[TurnEvent] = []
    for event in events:
        if event.type == "text_delta" and out and out[-1].type == "text_delta":
            text = str(out[-1].data.get("text", "")) + str(event.data.get("text", ""))
            out[-1] = TurnEvent(type="text_delta", data={**out[-1].data, "text": text})
        else:
            out.append(event)
    return out


class TurnEvents:
    """The events of one running turn on their way to its stream, in the order added.

    :meth:`add` only buffers. What is buffered goes out with the turn's next fenced write
    (the runner hands :meth:`pending` to checkpoint, commit, fail or park, which append
    the events before their own, so "done" still comes last: one round trip for both), or
    on its own ``flush_after_s`` after it was buffered when no such write comes first.
    One write at a time, so the stream keeps the order of :meth:`add`.

    Streamed text is coalesced before it becomes an event: the ``text_delta`` events
    added in a row become one, written ``text_after_s`` after the first of them at the
    latest (what a reader of the stream waits at most for text), at once when they hold
    ``text_bytes`` bytes, or earlier with anything else that is written (a fenced write,
    another event's flush). A reply streamed from a model costs a list append per delta
    and one event per flush, not an event (and its checks) per word; readers see the
    same text, in the same order. Each write also joins the text deltas it carries into
    one event, unless the previous write saw a live reader (the key
    :meth:`EventsMixin.read_events` sets with ``live=True``): then the chunks stay as
    they were written.
    """

    def __init__(
        self,
        protocol: EventSink,
        cid: str,
        turn_id: str,
        *,
        flush_after_s: float = 0.01,
        max_buffered: int = 64,
        text_after_s: float = defaults.DELTA_FLUSH_MS / 1000,
        text_bytes: int = defaults.DELTA_FLUSH_BYTES,
    ) -> None:
        self._protocol, self._cid, self._tid = protocol, cid, turn_id
        self._delay, self._max = flush_after_s, max_buffered
        self._text_delay, self._text_max = text_after_s, text_bytes
        self._buffer: list[TurnEvent] = []
        # Streamed text not yet an event: its pieces, their size, when the first came.
        self._text: list[str] = []
        self._text_size = 0
        self._text_since = 0.0
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task[None] | None = None
        # Whether the last write saw a live reader: then each text chunk stays an event.
        self._live = False

    async def add(self, event: TurnEvent) -> None:
        """Buffer ``event`` (ConvoqError at once if its data is not JSON-safe)."""
        data = event.data
        if event.type == "text_delta" and len(data) == 1 and type(data.get("text")) is str:
            await self.add_text(data["text"])
            return
        self._protocol.json_arg(data, "event data")
        self._take_text()  # the text streamed before it goes first
        self._buffer.append(event)
        if len(self._buffer) >= self._max:
            await self.flush()
        elif self._timer is None or self._timer.done():
            self._timer = asyncio.create_task(self._flush_later())

    async def add_text(self, text: str) -> None:
        """Buffer streamed ``text``: :meth:`add` of a ``text_delta`` event, without one."""
        if self._kept_text(text):
            await self.flush()

    def _kept_text(self, text: str) -> bool:
        """Keep streamed ``text``; whether it must be written now (its size bound)."""
        if not self._text:
            self._text_since = asyncio.get_running_loop().time()
            if self._timer is None or self._timer.done():
                self._timer = asyncio.create_task(self._flush_later())
        self._text.append(text)
        self._text_size += len(text.encode("utf-8"))
        return self._text_size >= self._text_max or self._text_delay <= 0

    def _take_text(self) -> None:
        """The streamed text so far becomes one ``text_delta`` event in the buffer."""
        if self._text:
            text = "".join(self._text)
            self._text.clear()
            self._text_size = 0
            self._buffer.append(TurnEvent(type="text_delta", data={"text": text}))

    async def flush(self) -> None:
        """Append what is buffered now (the streamed text too) to the stream."""
        async with self._lock:
            self._take_text()
            batch = self._buffer[:]
            if batch:
                self._live = await self._protocol.emit_many(self._cid, self._tid, self._out(batch))
                del self._buffer[: len(batch)]

    @contextlib.asynccontextmanager
    async def pending(self) -> AsyncIterator[list[TurnEvent]]:
        """The buffered events, for a fenced write to send along. They leave the buffer
        when the block ends without an error (kept for the next write otherwise)."""
        async with self._lock:
            self._take_text()
            batch = self._buffer[:]
            yield self._out(batch)
            del self._buffer[: len(batch)]

    def _out(self, batch: list[TurnEvent]) -> list[TurnEvent]:
        """What goes to the stream: with no live reader, runs of text deltas joined."""
        return batch if self._live else join_text_deltas(batch)

    async def close(self) -> None:
        """Stop a pending flush. Events still buffered are dropped: the turn was abandoned
        (its lease moved on, or Redis is gone) and its next run writes its own."""
        if self._timer is not None and not self._timer.done():
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
        self._buffer.clear()
        self._text.clear()

    async def _flush_later(self) -> None:
        """Flush ``flush_after_s`` after an event was buffered (``text_after_s`` after the
        first streamed text, when only text waits), again while more came in meanwhile;
        stop once nothing waits (a fenced write may have taken it all)."""
        loop = asyncio.get_running_loop()
        while self._buffer or self._text:
            due = loop.time() + self._delay if self._buffer else math.inf
            if self._text:
                due = min(due, self._text_since + self._text_delay)
            await asyncio.sleep(max(0.0, due - loop.time()))
            try:
                await self.flush()
            except Exception as exc:  # they stay buffered and go with the turn's next write
                log.warning("events of turn %s/%s not sent yet: %s", self._cid, self._tid, exc)
                return


def _handed(record: TurnRecord, events: list[tuple[str, TurnEvent]]) -> TurnRecord:
    """``record`` with the agent its ``handoff`` events moved it to (the first keeping the
    agent it was queued for as ``handed_from``)."""
    for _, event in events:
        to = event.data.get("to") if event.type == "handoff" else None
        if isinstance(to, str) and to != record.agent:
            handed = record.handed_from or record.agent
            record = dataclasses.replace(record, agent=to, handed_from=handed)
    return record

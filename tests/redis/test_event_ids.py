"""Several events in one stream entry: a turn's ending (its buffered events, the final
status, "done") is one XADD whose id reserves an id per event. Every one of those ids is a
place to resume from, for the protocol's reads, a client's ``events()`` and the gateway's
SSE with ``Last-Event-ID``: exactly the events after it come, in order. The entry carries
the record's live fields, so a waiter reads no record."""

from __future__ import annotations

import itertools
import re
from types import SimpleNamespace

import pytest
import redis

from convoq.client import AsyncTurnHandle
from convoq.errors import CorruptDataError
from convoq.gateway.sse import turn_events
from convoq.redis import TurnProtocol
from convoq.redis.protocol import TurnEnding
from convoq.turn_state import TurnEvent
from tests.support.protocol_helpers import exchange, submit_all

CID = "event-ids"
LEASE = 30_000
BUFFERED = [
    TurnEvent(type="text_delta", data={"text": "o"}),
    TurnEvent(type="text_delta", data={"text": "k"}),
    TurnEvent(type="assistant", data={"text": "ok", "note": "é/ü"}),
]
ENDING = ["text_delta", "text_delta", "assistant", "status", "done"]


async def run_turn(proto: TurnProtocol, tid: str, *, meddle: str = "") -> None:
    """Submit, acquire and commit ``tid`` with the buffered events. ``meddle``: an entry a
    minute ahead of the clock goes to the stream after the run started; the last id the
    record remembers is the running event's ("stale": the ending's XADD is refused, and it
    reads the stream's last id) or that entry's ("ahead": it reads it at once)."""
    await submit_all(proto, CID, tid)
    acquired = await proto.acquire(CID, worker_id="w", lease_ms=LEASE)
    assert acquired is not None and acquired.turn.turn_id == tid
    if meddle:
        stream = proto.keys.events(CID, tid)
        last = (await proto.redis.xrevrange(stream, count=1))[0][0].decode()
        ahead = f"{int(last.split('-')[0]) + 60_000}-5"
        await proto.redis.xadd(stream, {"type": "tool_call", "data": "{}"}, id=ahead)
        if meddle == "ahead":
            await proto.redis.hset(proto.keys.turn(CID, tid), "last_event", ahead)
    ending = TurnEnding(fence=acquired.fence, lease_ms=LEASE, events=BUFFERED)
    await proto.commit(CID, tid, exchange(tid), ending)


def key(event_id: str) -> tuple[int, int]:
    ms, seq = event_id.split("-")
    return int(ms), int(seq)


@pytest.mark.parametrize("meddle", ["", "stale", "ahead"])
async def test_resuming_from_every_event_id_gets_exactly_the_events_after_it(
    proto: TurnProtocol, redis_client: redis.Redis, meddle: str
) -> None:
    await run_turn(proto, "t1", meddle=meddle)
    everything = await proto.read_events(CID, "t1")
    types = [event.type for _, event in everything]
    expected = ["status", "status", *(["tool_call"] if meddle else []), *ENDING]
    assert types == expected
    assert everything[-3][1].data == {"text": "ok", "note": "é/ü"}
    ids = [event_id for event_id, _ in everything]
    assert all(key(a) < key(b) for a, b in itertools.pairwise(ids))
    # The ending is one entry, stored under its last event's id.
    entries = redis_client.xrange(proto.keys.events(CID, "t1"))
    assert len(entries) == len(expected) - len(ENDING) + 1
    assert entries[-1][0].decode() == ids[-1]

    handle = AsyncTurnHandle(SimpleNamespace(protocol=proto), CID, "t1")  # type: ignore[arg-type]
    for i, event_id in enumerate(["0", *ids]):
        rest = everything[i:]
        assert await proto.read_events(CID, "t1", after=event_id) == rest
        assert [pair async for pair in handle.events_with_ids(after=event_id, timeout=5)] == rest
        # The gateway's SSE body, as a reader reconnecting with Last-Event-ID sees it.
        chunks = [c async for c in turn_events(handle, event_id, keepalive_s=1, max_s=5)]
        sent = [re.match(r"id: (\S+)\nevent: (\S+)\n", c) for c in chunks if c.startswith("id:")]
        assert [(m.group(1), m.group(2)) for m in sent if m] == [(i, e.type) for i, e in rest]


async def test_a_waiter_takes_the_record_from_the_ending_entry(
    proto: TurnProtocol,
) -> None:
    await submit_all(proto, CID, "t1")
    record, _ = await proto.get_turn_and_last_event(CID, "t1")
    acquired = await proto.acquire(CID, worker_id="w", lease_ms=LEASE)
    assert acquired is not None
    _, running = await proto.get_turn_and_last_event(CID, "t1")
    await proto.commit(CID, "t1", exchange("t1", "fine"), TurnEnding(acquired.fence, LEASE))

    batch, seen = await proto.read_events_and_turn(record, after=running, block_ms=0)

    assert [event.type for _, event in batch] == ["status", "done"]
    stored = await proto.get_turn(CID, "t1")
    assert stored.status == "succeeded" and stored.result is not None
    for field in ("status", "result", "error", "attempts", "started_ms", "finished_ms"):
        assert getattr(seen, field) == getattr(stored, field), field


async def test_a_waiter_woken_by_the_start_reads_no_record_and_one_without_news_does(
    proto: TurnProtocol,
) -> None:
    await submit_all(proto, CID, "t1")
    record, queued = await proto.get_turn_and_last_event(CID, "t1")
    assert await proto.acquire(CID, worker_id="w", lease_ms=LEASE) is not None
    await proto.redis.hset(proto.keys.turn(CID, "t1"), "attempts", "x")  # unreadable

    # Woken by "running": the status comes from the event, the record is not read.
    batch, seen = await proto.read_events_and_turn(record, after=queued, block_ms=0)
    assert [event.data for _, event in batch] == [{"status": "running"}]
    assert seen.status == "running"
    # No news (the block ran out): the record is read, and here it does not parse.
    with pytest.raises(CorruptDataError):
        await proto.read_events_and_turn(seen, after=batch[-1][0], block_ms=0)

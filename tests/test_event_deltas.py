"""Streamed text reaches a turn's event stream coalesced: the deltas added in a row become
one event, written with the turn's next write, at its size bound or at its time bound
(what a reader waits at most), in order among the other events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from convoq.messages import Message
from convoq.redis import TurnProtocol
from convoq.redis._events import TurnEvents, join_text_deltas
from convoq.turn_state import TurnEvent

CID = "deltas"


@pytest.fixture
async def proto(redis_url: str, key_prefix: str) -> AsyncIterator[TurnProtocol]:
    protocol = TurnProtocol.from_url(redis_url, prefix=key_prefix)
    await protocol.submit(CID, "t1", agent="a", message=Message.user("hi"), options={})
    yield protocol
    await protocol.close()


def delta(text: str) -> TurnEvent:
    return TurnEvent(type="text_delta", data={"text": text})


async def deltas(proto: TurnProtocol) -> list[str]:
    events = await proto.read_events(CID, "t1")
    return [e.data["text"] for _, e in events if e.type == "text_delta"]


def test_runs_of_deltas_are_joined_in_order() -> None:
    other = TurnEvent(type="tool_call", data={"id": "c"})
    joined = join_text_deltas([delta("a"), delta(" b"), other, delta("c"), delta(" d")])
    assert joined == [delta("a b"), other, delta("c d")]


async def test_streamed_text_is_one_event_per_write_live_reader_or_not(
    proto: TurnProtocol,
) -> None:
    events = TurnEvents(proto, CID, "t1", flush_after_s=600, text_after_s=600)  # by hand
    for word in ("one", " two", " three"):
        await events.add(delta(word))
    await events.flush()
    assert await deltas(proto) == ["one two three"]

    await proto.read_events(CID, "t1", after="$", block_ms=1, live=True)  # someone follows
    await events.add(delta(" four"))
    await events.flush()  # learns about the reader
    for word in (" five", " six"):
        await events.add(delta(word))
    await events.flush()
    async with events.pending() as batch:  # what a fenced write would carry
        assert batch == []
    await events.add(delta(" seven"))
    other = TurnEvent(type="tool_call", data={"id": "c"})
    await events.add(other)
    await events.add(delta(" eight"))
    async with events.pending() as batch:  # text keeps its place among the other events
        assert batch == [delta(" seven"), other, delta(" eight")]
    assert await deltas(proto) == ["one two three", " four", " five six"]
    await events.close()


async def test_text_goes_out_on_its_own_at_its_size_or_its_time_bound(
    proto: TurnProtocol,
) -> None:
    events = TurnEvents(proto, CID, "t1", flush_after_s=600, text_after_s=600, text_bytes=10)
    await events.add(delta("12345"))
    assert await deltas(proto) == []
    await events.add(delta("67890"))  # 10 bytes: written at once, no flush asked for
    assert await deltas(proto) == ["1234567890"]
    await events.close()

    events = TurnEvents(proto, CID, "t1", flush_after_s=600, text_after_s=0.05)
    await events.add(delta("later"))
    for _ in range(200):  # the timer writes it (bounded: 10 s)
        if len(await deltas(proto)) == 2:
            break
        await asyncio.sleep(0.05)
    assert await deltas(proto) == ["1234567890", "later"]
    await events.close()

    events = TurnEvents(proto, CID, "t1", flush_after_s=600, text_after_s=0)
    await events.add(delta("at"))
    await events.add(delta(" once"))  # 0: each delta is written as it comes
    assert await deltas(proto) == ["1234567890", "later", "at", " once"]
    await events.close()

"""Streamed text reaches a turn's event stream as one delta event per write, unless someone
follows the stream live (a reader of ``events()``), who gets each delta as it came."""

from __future__ import annotations

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


async def test_deltas_are_joined_per_write_until_a_live_reader_shows_up(
    proto: TurnProtocol,
) -> None:
    events = TurnEvents(proto, CID, "t1", flush_after_s=600)  # flushed by the test only
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
    await events.add(delta(" eight"))
    async with events.pending() as batch:
        assert batch == [delta(" seven"), delta(" eight")]
    assert await deltas(proto) == ["one two three", " four", " five", " six"]
    await events.close()

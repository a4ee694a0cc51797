"""The worker's timer poll (:class:`convoq.worker._timers.TimerPoll`) on a real Redis: it
fires due conversations and kicks those that were idle, fires what a repaired index
names, and keeps polling after an error."""

from __future__ import annotations

import asyncio

import pytest

from convoq.messages import Message
from convoq.redis import TurnProtocol
from convoq.redis._due import Due
from convoq.worker._timers import TimerPoll
from tests.support.protocol_helpers import submit_all


async def _schedule(proto: TurnProtocol, cid: str, tid: str, due: Due) -> None:
    await proto.schedule(cid, tid, agent="bot", message=Message.user(tid), options={}, due=due)


async def _now_ms(proto: TurnProtocol) -> int:
    seconds, micros = await proto.redis.time()
    return int(seconds * 1000 + micros // 1000)


async def test_a_poll_fires_due_conversations_and_kicks_the_idle_ones(proto: TurnProtocol) -> None:
    kicked: list[str] = []

    async def kick(cid: str) -> None:
        kicked.append(cid)

    now = await _now_ms(proto)
    await _schedule(proto, "idle", "a", Due(at_ms=now - 5))
    await submit_all(proto, "busy", "running")
    await _schedule(proto, "busy", "b", Due(at_ms=now - 5))
    await _schedule(proto, "later", "c", Due(at_ms=now + 600_000))
    poll = TimerPoll(proto, kick, interval_s=0.1)
    assert await poll.poll_once() == 2
    assert kicked == ["idle"]  # "busy" had a turn in line already: its runner goes on
    assert await poll.poll_once() == 0


async def test_the_poll_fires_what_the_repaired_index_names(proto: TurnProtocol) -> None:
    async def kick(cid: str) -> None:
        pass

    now = await _now_ms(proto)
    await _schedule(proto, "c", "t", Due(at_ms=now - 5))
    await proto.redis.delete(proto.keys.timer_index())  # a client died between its writes
    poll = TimerPoll(proto, kick, interval_s=0.1)
    assert await poll.poll_once() == 0  # no entry: the poll cannot see it
    assert await proto.repair_timer_index() == {"c": 1}  # what the sweep does every period
    assert await poll.poll_once() == 1
    assert (await proto.get_turn("c", "t")).status == "queued"


async def test_a_failing_kick_is_left_to_the_sweeper_and_the_poll_goes_on(
    proto: TurnProtocol, caplog: pytest.LogCaptureFixture
) -> None:
    async def kick(cid: str) -> None:
        raise ConnectionError("broker down")

    now = await _now_ms(proto)
    await _schedule(proto, "c", "t", Due(at_ms=now - 5))
    poll = TimerPoll(proto, kick, interval_s=0.05)
    task = asyncio.create_task(poll.run_forever())
    try:
        for _ in range(500):  # 10 s at most, on a loaded machine
            if (await proto.get_turn("c", "t")).status == "queued":
                break
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert (await proto.get_turn("c", "t")).status == "queued"
    # Queued with no lease: what the sweeper kicks.
    assert "c" in await proto.sweep_candidates()
    assert "could not kick c" in caplog.text

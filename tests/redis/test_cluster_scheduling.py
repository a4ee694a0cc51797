"""Scheduled turns on a real 3-primary Redis Cluster: the timer index sits on one slot and
each conversation's timers on its own, on every primary. Timers fire once each, never
before their due time by the Redis clock of their node, even with two pollers racing;
cancel removes a timer; the index repair's SCAN finds timers on every primary."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY

from convoq.ids import key_part
from convoq.messages import Message
from convoq.redis import TurnProtocol
from convoq.redis._due import Due
from convoq.worker._timers import TimerPoll
from tests.support.protocol_helpers import open_protocol
from tests.support.redis_cluster import RedisClusterNodes


@pytest.fixture
async def proto(redis_cluster: RedisClusterNodes, key_prefix: str) -> AsyncIterator[TurnProtocol]:
    async with open_protocol(redis_cluster.url, key_prefix) as protocol:
        yield protocol


async def _schedule(proto: TurnProtocol, cid: str, tid: str, due: Due) -> None:
    await proto.schedule(cid, tid, agent="bot", message=Message.user(tid), options={}, due=due)


async def _inbox(proto: TurnProtocol, cid: str) -> list[str]:
    return [t.decode() for t in await proto.redis.lrange(proto.keys.inbox(cid), 0, -1)]


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def _spread(redis_cluster: RedisClusterNodes, proto: TurnProtocol, per_primary: int) -> list[str]:
    """Conversations whose timers sit on every primary (the index on one of them)."""
    cids = redis_cluster.conversations_on_every_primary(proto.keys.prefix, per_primary)
    client = redis_cluster.client()
    try:
        nodes = {client.get_node_from_key(proto.keys.timers(cid)).name for cid in cids}
        index = client.keyslot(proto.keys.timer_index())
        slots = {client.keyslot(proto.keys.timers(cid)) for cid in cids}
    finally:
        client.close()
    assert len(nodes) == 3 and index not in slots
    return cids


async def test_timers_on_every_primary_fire_once_never_early_with_two_pollers(
    proto: TurnProtocol, redis_cluster: RedisClusterNodes
) -> None:
    cids = _spread(redis_cluster, proto, 2)
    for cid in cids:
        await _schedule(proto, cid, "soon", Due(delay_ms=1000))
        await _schedule(proto, cid, "later", Due(delay_ms=600_000))
    for cid in cids:
        # Named as due by a caller whose clock is ahead: the node's clock decides.
        keys = [proto.keys.inbox(cid), proto.keys.timers(cid)]
        keys += [proto.keys.turn(cid, "later"), proto.keys.events(cid, "later")]
        reply = await proto.scripts.run("fire", keys, [proto.events_maxlen, "later"])
        assert reply[1:3] == [-1, 0]
    kicked: list[str] = []

    async def kick(cid: str) -> None:
        kicked.append(cid)

    fired_before = _sample("convoq_timers_fired_total")
    lags_before = _sample("convoq_timer_lag_seconds_count")
    queued, deadline = 0, time.monotonic() + 30
    async with open_protocol(redis_cluster.url, proto.keys.prefix) as other:
        polls = [TimerPoll(p, kick, interval_s=0.05) for p in (proto, other, proto)]
        while queued < len(cids) and time.monotonic() < deadline:
            queued += sum(await asyncio.gather(*(p.poll_once() for p in polls)))
            await asyncio.sleep(0.05)
        assert sum(await asyncio.gather(*(p.poll_once() for p in polls))) == 0
    assert queued == len(cids)
    assert sorted(kicked) == sorted(cids)  # each idle conversation kicked once
    for cid in cids:
        assert await _inbox(proto, cid) == ["soon"]
        record = await proto.get_turn(cid, "soon")
        assert record.status == "queued" and record.due_ms is not None
        # fired_ms is the TIME of the conversation's own node, read inside the script.
        assert record.fired_ms is not None and record.fired_ms >= record.due_ms
        events = await proto.read_events(cid, "soon")
        statuses = [e.data.get("status") for _, e in events if e.type == "status"]
        assert statuses == ["scheduled", "queued"]  # queued once
        [waiting] = await proto.scheduled_turns(cid)
        assert waiting.turn_id == "later"
        index = await proto.redis.zscore(proto.keys.timer_index(), key_part(cid))
        assert index == waiting.due_ms  # the index names the timer left
    assert _sample("convoq_timers_fired_total") == fired_before + len(cids)
    assert _sample("convoq_timer_lag_seconds_count") == lags_before + len(cids)


async def test_cancel_removes_the_timer_on_every_primary(
    proto: TurnProtocol, redis_cluster: RedisClusterNodes
) -> None:
    cids = _spread(redis_cluster, proto, 1)
    for cid in cids:
        await _schedule(proto, cid, "t", Due(delay_ms=0))
        assert await proto.cancel(cid, "t") == "cancelled"
        assert await proto.redis.zcard(proto.keys.timers(cid)) == 0
        assert (await proto.get_turn(cid, "t")).status == "cancelled"
        assert await proto.scheduled_turns(cid) == []
    due, _ = await proto.due_conversations()
    assert sorted(due) == sorted(cids)  # stale entries: the fire finds nothing
    for cid in cids:
        assert (await proto.fire_due(cid)).queued == 0
        assert await _inbox(proto, cid) == []
    assert await proto.redis.zcard(proto.keys.timer_index()) == 0


async def test_the_index_repair_finds_timers_on_every_primary(
    proto: TurnProtocol, redis_cluster: RedisClusterNodes
) -> None:
    cids = _spread(redis_cluster, proto, 2)
    for cid in cids:
        await _schedule(proto, cid, "t1", Due(delay_ms=0))
        await _schedule(proto, cid, "t2", Due(delay_ms=600_000))
    # Clients that died between their two writes: timers without index entries.
    await proto.redis.delete(proto.keys.timer_index())
    assert (await proto.due_conversations())[0] == []
    assert await proto.repair_timer_index() == {cid: 2 for cid in cids}
    due, _ = await proto.due_conversations()
    assert sorted(due) == sorted(cids)
    for cid in cids:
        assert (await proto.fire_due(cid)).queued == 1
        assert await _inbox(proto, cid) == ["t1"]

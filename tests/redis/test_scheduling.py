"""The scripts of scheduled turns against a real Redis: ``schedule`` stores the record and
its timer together (the index after), ``fire`` queues due turns exactly once and never
early, ``cancel`` removes a timer, and each is safe to resend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from convoq.errors import CorruptDataError, InvalidScheduleError
from convoq.ids import key_part
from convoq.messages import Message
from convoq.redis import TurnProtocol
from convoq.redis._due import Due
from tests.support.protocol_helpers import open_protocol, submit_all
from tests.support.redis_proxy import LossyProxy
from tests.support.redis_server import RedisServer


async def _schedule(
    proto: TurnProtocol, cid: str, tid: str, due: Due, key: str | None = None
) -> str:
    result = await proto.schedule(
        cid, tid, agent="bot", message=Message.user(tid), options={}, due=due,
        idempotency_key=key,
    )  # fmt: skip
    return result.turn_id


async def _inbox(proto: TurnProtocol, cid: str) -> list[str]:
    return [t.decode() for t in await proto.redis.lrange(proto.keys.inbox(cid), 0, -1)]


async def _now_ms(proto: TurnProtocol) -> int:
    seconds, micros = await proto.redis.time()
    return int(seconds * 1000 + micros // 1000)


async def test_a_scheduled_turn_has_its_record_and_timer_but_no_place_in_line(
    proto: TurnProtocol,
) -> None:
    before = await _now_ms(proto)
    await _schedule(proto, "c", "t1", Due(delay_ms=60_000))
    record = await proto.get_turn("c", "t1")
    assert record.status == "scheduled"
    assert record.due_ms is not None and before + 60_000 <= record.due_ms <= before + 62_000
    assert await _inbox(proto, "c") == []
    index = await proto.redis.zscore(proto.keys.timer_index(), key_part("c"))
    assert index == record.due_ms
    listed = await proto.scheduled_turns("c")
    assert [(s.turn_id, s.due_ms) for s in listed] == [("t1", record.due_ms)]


async def test_fire_queues_only_due_turns_in_due_order_and_reindexes(proto: TurnProtocol) -> None:
    now = await _now_ms(proto)
    await _schedule(proto, "c", "late", Due(at_ms=now + 600_000))
    await _schedule(proto, "c", "second", Due(at_ms=now - 10))
    await _schedule(proto, "c", "first", Due(at_ms=now - 20))
    fired = await proto.fire_due("c")
    assert (fired.position, fired.queued) == (0, 2)
    assert await _inbox(proto, "c") == ["first", "second"]
    for tid in ("first", "second"):
        record = await proto.get_turn("c", tid)
        assert record.status == "queued"
        assert record.fired_ms is not None and record.due_ms is not None
        assert record.fired_ms >= record.due_ms
    assert (await proto.get_turn("c", "late")).status == "scheduled"
    # The index now names the next timer, not the ones fired.
    index = await proto.redis.zscore(proto.keys.timer_index(), key_part("c"))
    assert index == now + 600_000


async def test_a_fired_turn_goes_behind_turns_queued_before_it_fired(proto: TurnProtocol) -> None:
    now = await _now_ms(proto)
    await _schedule(proto, "c", "scheduled", Due(at_ms=now - 1))
    await submit_all(proto, "c", "submitted-after-scheduling")
    fired = await proto.fire_due("c")
    assert fired.position == 1  # the conversation was busy: no kick owed
    assert await _inbox(proto, "c") == ["submitted-after-scheduling", "scheduled"]


async def test_fire_again_changes_nothing(proto: TurnProtocol) -> None:
    now = await _now_ms(proto)
    await _schedule(proto, "c", "t", Due(at_ms=now - 1))
    assert (await proto.fire_due("c")).queued == 1
    again = await proto.fire_due("c")
    assert (again.position, again.queued) == (-1, 0)
    # Even the raw script resent for the same turn (its reply lost) queues nothing.
    keys = [proto.keys.inbox("c"), proto.keys.timers("c")]
    keys += [proto.keys.turn("c", "t"), proto.keys.events("c", "t")]
    reply = await proto.scripts.run("fire", keys, [proto.events_maxlen, "t"])
    assert reply[1:3] == [-1, 0]
    assert await _inbox(proto, "c") == ["t"]
    events = await proto.read_events("c", "t")
    statuses = [e.data.get("status") for _, e in events if e.type == "status"]
    assert statuses == ["scheduled", "queued"]


async def test_a_timer_not_yet_due_does_not_fire(proto: TurnProtocol) -> None:
    now = await _now_ms(proto)
    await _schedule(proto, "c", "t", Due(at_ms=now + 60_000))
    keys = [proto.keys.inbox("c"), proto.keys.timers("c")]
    keys += [proto.keys.turn("c", "t"), proto.keys.events("c", "t")]
    # Named as due by a caller whose clock is ahead: the script's clock decides.
    reply = await proto.scripts.run("fire", keys, [proto.events_maxlen, "t"])
    assert reply[1:3] == [-1, 0]
    assert (await proto.get_turn("c", "t")).status == "scheduled"


async def test_cancel_removes_the_timer_and_a_later_fire_does_nothing(proto: TurnProtocol) -> None:
    now = await _now_ms(proto)
    await _schedule(proto, "c", "t", Due(at_ms=now - 1))
    assert await proto.cancel("c", "t") == "cancelled"
    assert await proto.redis.zcard(proto.keys.timers("c")) == 0
    assert (await proto.get_turn("c", "t")).status == "cancelled"
    assert await proto.scheduled_turns("c") == []
    fired = await proto.fire_due("c")
    assert fired.queued == 0 and await _inbox(proto, "c") == []
    # The stale index entry went with that fire.
    assert await proto.redis.zscore(proto.keys.timer_index(), key_part("c")) is None


async def test_a_timer_left_after_cancel_fires_nothing(proto: TurnProtocol) -> None:
    # A cancel that could not remove the timer (an older client, no timers key given):
    # the fire finds the turn cancelled, removes the timer and queues nothing.
    now = await _now_ms(proto)
    await _schedule(proto, "c", "t", Due(at_ms=now - 1))
    await proto.redis.hset(proto.keys.turn("c", "t"), "status", "cancelled")
    fired = await proto.fire_due("c")
    assert fired.queued == 0 and await _inbox(proto, "c") == []
    assert await proto.redis.zcard(proto.keys.timers("c")) == 0


async def test_the_idempotency_key_answers_with_the_first_turn(proto: TurnProtocol) -> None:
    first = await _schedule(proto, "c", "t1", Due(delay_ms=60_000), key="k")
    again = await proto.schedule(
        "c", "t2", agent="bot", message=Message.user("t1"), options={},
        due=Due(delay_ms=60_000), idempotency_key="k",
    )  # fmt: skip
    assert (first, again.turn_id, again.duplicate) == ("t1", "t1", True)
    assert await proto.redis.exists(proto.keys.turn("c", "t2")) == 0
    assert await proto.redis.zcard(proto.keys.timers("c")) == 1


async def test_a_resend_of_the_same_turn_id_changes_nothing(proto: TurnProtocol) -> None:
    await _schedule(proto, "c", "t", Due(delay_ms=60_000))
    record = await proto.get_turn("c", "t")
    again = await proto.schedule(
        "c", "t", agent="bot", message=Message.user("t"), options={}, due=Due(delay_ms=1)
    )
    assert again.duplicate
    assert (await proto.get_turn("c", "t")).due_ms == record.due_ms
    assert len(await proto.read_events("c", "t")) == 1


async def test_a_lost_reply_to_schedule_stores_one_turn(
    redis_server: RedisServer, key_prefix: str
) -> None:
    proxy = LossyProxy(redis_server.port)
    try:
        async with open_protocol(proxy.url, key_prefix) as proto:
            await _schedule(proto, "c", "warm", Due(delay_ms=60_000))  # scripts loaded
            proxy.drop_reply_to(b"EVALSHA")
            await _schedule(proto, "c", "t", Due(delay_ms=60_000))
            assert proxy.dropped == 1
            assert await proto.redis.zcard(proto.keys.timers("c")) == 2
            assert len(await proto.read_events("c", "t")) == 1
    finally:
        proxy.close()


@pytest.mark.parametrize("bad", [Due(at_ms=-5), Due(delay_ms=-1)])
async def test_a_bad_due_time_is_refused_with_nothing_written(
    proto: TurnProtocol, bad: Due
) -> None:
    with pytest.raises(InvalidScheduleError):
        await _schedule(proto, "c", "t", bad)
    assert await proto.redis.keys(f"{proto.keys.prefix}:*") == []


async def test_a_timers_key_of_another_type_is_refused_with_nothing_written(
    proto: TurnProtocol,
) -> None:
    await proto.redis.set(proto.keys.timers("c"), "not a zset")
    with pytest.raises(CorruptDataError):
        await _schedule(proto, "c", "t", Due(delay_ms=1000))
    assert await proto.redis.exists(proto.keys.turn("c", "t")) == 0
    assert await proto.redis.exists(proto.keys.events("c", "t")) == 0


async def test_with_a_time_and_a_delay_the_later_wins(proto: TurnProtocol) -> None:
    now = await _now_ms(proto)
    await _schedule(proto, "c", "delay-later", Due(at_ms=now + 1000, delay_ms=60_000))
    await _schedule(proto, "c", "time-later", Due(at_ms=now + 600_000, delay_ms=1000))
    first = (await proto.get_turn("c", "delay-later")).due_ms
    assert first is not None and now + 60_000 <= first <= now + 62_000
    assert (await proto.get_turn("c", "time-later")).due_ms == now + 600_000


async def test_the_index_is_repaired_from_the_timers(proto: TurnProtocol) -> None:
    now = await _now_ms(proto)
    await _schedule(proto, "c", "t", Due(at_ms=now - 1))
    await _schedule(proto, "c", "later", Due(at_ms=now + 60_000))
    await proto.redis.delete(proto.keys.timer_index())  # a client died between its writes
    assert (await proto.due_conversations())[0] == []
    assert await proto.repair_timer_index() == {"c": 2}  # its timers, counted
    due, _ = await proto.due_conversations()
    assert due == ["c"]


@pytest.fixture
def cids() -> Iterator[list[str]]:
    yield ["a b{c}", "plain"]


async def test_odd_conversation_ids_round_trip_through_the_index(
    proto: TurnProtocol, cids: list[str]
) -> None:
    now = await _now_ms(proto)
    for cid in cids:
        await _schedule(proto, cid, "t", Due(at_ms=now - 1))
    due, _ = await proto.due_conversations()
    assert sorted(due) == sorted(cids)


@pytest.fixture
async def other(redis_url: str, key_prefix: str) -> AsyncIterator[TurnProtocol]:
    async with open_protocol(redis_url, key_prefix) as protocol:
        yield protocol


async def test_racing_fires_queue_each_turn_once(proto: TurnProtocol, other: TurnProtocol) -> None:
    import asyncio

    now = await _now_ms(proto)
    for i in range(30):
        await _schedule(proto, "c", f"t{i:02}", Due(at_ms=now - 100 + i))
    results = await asyncio.gather(*(p.fire_due("c") for p in (proto, other, proto, other)))
    assert sum(r.queued for r in results) == 30
    assert await _inbox(proto, "c") == [f"t{i:02}" for i in range(30)]


async def test_scheduled_turns_count_against_no_queue_limit(
    redis_url: str, key_prefix: str
) -> None:
    from convoq.limits import QueueLimits

    limits = QueueLimits(per_conversation=1, per_agent=1, total=1)
    async with open_protocol(redis_url, key_prefix, queue_limits=limits) as proto:
        now = await _now_ms(proto)
        await submit_all(proto, "c", "queued")  # the one place the limits allow
        await _schedule(proto, "c", "t1", Due(at_ms=now - 1))
        await _schedule(proto, "other", "t2", Due(at_ms=now - 1))
        counted = {"*": 1, "bot": 1}  # the submitted turn alone: both limits reached
        assert await proto.queued_counts() == counted
        assert (await proto.fire_due("c")).queued == 1  # joins the line over the limit
        assert await _inbox(proto, "c") == ["queued", "t1"]
        assert (await proto.fire_due("other")).position == 0
        assert await proto.queued_counts() == counted

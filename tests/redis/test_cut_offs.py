"""Runs cut off versus runs crashed, in the turn protocol against a real Redis: a run its
worker reports lost (``report_cut_off``) is given back and counted apart, so
``max_attempts`` counts only the runs whose worker never came back, and ``max_cut_offs``
bounds the others. The failed turn's error says which limit it hit, with the counts."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from convoq.errors import UnknownTurnError
from convoq.messages import Message
from convoq.redis import Acquired, TurnProtocol
from convoq.redis.protocol import TurnEnding
from tests.support.protocol_helpers import submit_all

pytestmark = pytest.mark.slowpaths

CID = "conv-cut"
LEASE = 30_000


@pytest.fixture
def protocol_url(store_url: str) -> str:
    return store_url


async def take(proto: TurnProtocol, worker: str = "w1", **limits: int) -> Acquired | None:
    return await proto.acquire(CID, worker_id=worker, lease_ms=LEASE, **limits)


async def run_and_lose(
    proto: TurnProtocol, store_client: redis.Redis, *, report: bool, **limits: int
) -> Acquired:
    """A run of the head turn whose lease then lapses; its worker reports it cut off (it
    lived) or not (it died)."""
    acquired = await take(proto, **limits)
    assert acquired is not None
    store_client.delete(proto.keys.lease(CID))  # the lease lapsed
    if report:
        assert await proto.report_cut_off(CID, acquired.turn.turn_id, fence=acquired.fence)
    return acquired


def fields(proto: TurnProtocol, store_client: redis.Redis, tid: str, *names: str) -> list[Any]:
    values = store_client.hmget(proto.keys.turn(CID, tid), list(names))
    return [None if v is None else v.decode() for v in values]


async def test_runs_cut_off_do_not_count_as_attempts(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await submit_all(proto, CID, "t1")
    for _ in range(4):  # twice max_attempts, every run reported back
        lost = await run_and_lose(proto, store_client, report=True, max_attempts=2)
        assert lost.turn.turn_id == "t1"
    last = await take(proto, max_attempts=2)
    assert last is not None and last.turn.turn_id == "t1"
    assert last.turn.attempts == 5  # every run that started is still an attempt
    assert fields(proto, store_client, "t1", "runs", "cut_offs") == ["1", "4"]
    await proto.commit(
        CID, "t1", [last.turn.input, Message.assistant("ok")], TurnEnding(fence=last.fence)
    )
    assert (await proto.get_turn(CID, "t1")).status == "succeeded"


async def test_runs_nobody_reports_still_fail_the_turn_and_say_they_crashed(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await submit_all(proto, CID, "t1", "t2")
    await run_and_lose(proto, store_client, report=False, max_attempts=2)
    await run_and_lose(proto, store_client, report=True, max_attempts=2)
    await run_and_lose(proto, store_client, report=False, max_attempts=2)
    nxt = await take(proto, max_attempts=2)
    assert nxt is not None and nxt.turn.turn_id == "t2"
    record = await proto.get_turn(CID, "t1")
    assert record.status == "failed" and record.error is not None
    assert record.error["type"] == "MaxAttemptsExceededError"
    assert "worker died in 2 runs" in record.error["message"]
    assert "crash or an OOM kill" in record.error["message"]
    details = record.error["details"]
    assert (details["crashed_runs"], details["cut_off_runs"]) == (2, 1)
    assert (details["attempts"], details["max_attempts"]) == (3, 2)


async def test_cut_offs_are_bounded_apart_and_worded_as_the_network(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await submit_all(proto, CID, "t1", "t2")
    for _ in range(3):
        await run_and_lose(proto, store_client, report=True, max_cut_offs=3)
    nxt = await take(proto, max_cut_offs=3)
    assert nxt is not None and nxt.turn.turn_id == "t2"
    record = await proto.get_turn(CID, "t1")
    assert record.status == "failed" and record.error is not None
    assert record.error["type"] == "MaxCutOffsExceededError"
    assert "lost their connection to Redis in 3 runs" in record.error["message"]
    assert "check the network" in record.error["message"]
    details = record.error["details"]
    assert (details["cut_off_runs"], details["crashed_runs"], details["max_cut_offs"]) == (3, 0, 3)


async def test_a_run_is_reported_once(proto: TurnProtocol, store_client: redis.Redis) -> None:
    await submit_all(proto, CID, "t1")
    first = await run_and_lose(proto, store_client, report=True)
    assert not await proto.report_cut_off(CID, "t1", fence=first.fence)  # again: seen
    second = await run_and_lose(proto, store_client, report=False)
    assert second.fence > first.fence
    # A run older than one reported already is not given back (it counts as crashed).
    assert not await proto.report_cut_off(CID, "t1", fence=first.fence - 1)
    assert fields(proto, store_client, "t1", "runs", "cut_offs") == ["1", "1"]
    assert await proto.report_cut_off(CID, "t1", fence=second.fence)
    assert fields(proto, store_client, "t1", "runs", "cut_offs") == ["0", "2"]


async def test_a_report_while_the_lease_is_the_runs_frees_it_for_the_next_run(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await submit_all(proto, CID, "t1")
    lost = await take(proto)
    assert lost is not None
    assert await take(proto, "w2") is None  # the lease holds
    assert await proto.report_cut_off(CID, "t1", fence=lost.fence)
    assert not store_client.exists(proto.keys.lease(CID))
    again = await take(proto, "w2")
    assert again is not None and again.turn.attempts == 2
    resumed = [e.data for _, e in await proto.read_events(CID, "t1") if e.type == "resumed"]
    assert resumed == [{"reason": "worker_cut_off", "attempt": 2}]


async def test_a_late_report_leaves_the_run_that_took_over_alone(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await submit_all(proto, CID, "t1")
    lost = await run_and_lose(proto, store_client, report=False)
    current = await take(proto, "w2")
    assert current is not None
    assert await proto.report_cut_off(CID, "t1", fence=lost.fence)  # given back, late
    lease = store_client.hget(proto.keys.lease(CID), "fence")
    assert lease is not None and int(lease) == current.fence  # still the new run's
    assert fields(proto, store_client, "t1", "runs", "cut_offs", "cut_off") == ["1", "1", None]
    resumed = [e.data for _, e in await proto.read_events(CID, "t1") if e.type == "resumed"]
    assert resumed == [{"reason": "worker_lost", "attempt": 2}]


async def test_reports_for_finished_or_unknown_turns_change_nothing(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await submit_all(proto, CID, "t1")
    acquired = await take(proto)
    assert acquired is not None
    await proto.commit(
        CID, "t1", [acquired.turn.input, Message.assistant("ok")], TurnEnding(fence=acquired.fence)
    )
    assert not await proto.report_cut_off(CID, "t1", fence=acquired.fence)
    assert fields(proto, store_client, "t1", "runs", "cut_offs") == ["1", None]
    with pytest.raises(UnknownTurnError):
        await proto.report_cut_off(CID, "nope", fence=acquired.fence)

"""A run that goes on with a turn an earlier run started says so: a ``resumed`` event
naming why (worker_lost, worker_stopped, approval_decided, approval_expired) and the
attempt it is. An approval's resume is no new attempt: ``attempts`` and CONVOQ_MAX_ATTEMPTS
count the runs that started and were lost, across a park. The protocol against a real
redis-server, then real worker processes: one killed with -9 mid-turn, one resuming an
approved turn."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from convoq.client import AsyncClient
from convoq.errors import TurnTimeoutError
from convoq.gateway.sse import turn_events
from convoq.messages import Message, ToolCall
from convoq.redis import Acquired, TurnProtocol
from convoq.redis.protocol import TurnEnding
from convoq.turn_state import TurnEvent, TurnState
from tests.support.protocol_helpers import submit_all
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool, wait_until

CID = "resumed-1"
LEASE = 30_000


async def _take(proto: TurnProtocol, worker: str = "w1", max_attempts: int = 5) -> Acquired:
    got = await proto.acquire(CID, worker_id=worker, lease_ms=LEASE, max_attempts=max_attempts)
    assert got is not None
    return got


def _lose(proto: TurnProtocol, r: redis.Redis) -> None:
    """The run's worker died: its lease lapses (the key goes, as PX would make it)."""
    assert r.delete(proto.keys.lease(CID)) == 1


async def _park(proto: TurnProtocol, got: Acquired) -> None:
    call = ToolCall(id="call-1", name="transfer", arguments={})
    state = TurnState(
        messages=[got.turn.input, Message.assistant("", [call])], steps=1, pending=[call]
    )
    await proto.park(CID, got.turn.turn_id, fence=got.fence, state=state, approval_ttl_ms=LEASE)


async def _events(proto: TurnProtocol, tid: str = "t1") -> list[TurnEvent]:
    return [event for _, event in await proto.read_events(CID, tid)]


def _resumed(events: list[TurnEvent]) -> list[dict[str, Any]]:
    return [e.data for e in events if e.type == "resumed"]


async def test_a_run_taking_over_a_lapsed_lease_says_worker_lost(
    proto: TurnProtocol, r: redis.Redis
) -> None:
    await submit_all(proto, CID, "t1")
    first = await _take(proto)
    assert first.turn.attempts == 1 and _resumed(await _events(proto)) == []
    _lose(proto, r)
    second = await _take(proto, "w2")
    assert second.turn.attempts == 2
    events = await _events(proto)
    assert [(e.type, e.data.get("status")) for e in events] == [
        ("status", "queued"),
        ("status", "running"),
        ("resumed", None),  # the status stays running: the turn was never anything else
    ]
    assert events[-1].data == {"reason": "worker_lost", "attempt": 2}


async def test_the_gateway_stream_and_the_handle_carry_the_resumed_event(
    proto: TurnProtocol, r: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    await submit_all(proto, CID, "t1")
    await _take(proto)
    _lose(proto, r)
    await _take(proto, "w2")
    async with AsyncClient(redis_url, prefix=key_prefix, partitions=4) as client:
        handle = client.handle(CID, "t1")
        chunks = [c async for c in turn_events(handle, "0", keepalive_s=0.2, max_s=1.0)]
        seen = []
        with contextlib.suppress(TurnTimeoutError):  # no "done" yet: the run goes on
            async for event in handle.events(timeout=0.5):
                seen.append(event)
    [sse] = [c for c in chunks if "event: resumed" in c]
    assert sse.endswith('data: {"reason":"worker_lost","attempt":2}\n\n')
    assert [e.data for e in seen if e.type == "resumed"] == [
        {"reason": "worker_lost", "attempt": 2}
    ]


async def test_a_handed_off_turn_taken_again_with_the_kept_fence_is_the_same_run(
    proto: TurnProtocol,
) -> None:
    await submit_all(proto, CID, "t1", "t2")
    first = await _take(proto)
    ending = TurnEnding(fence=first.fence, lease_ms=LEASE, requeue=True)
    await proto.commit(CID, "t1", [first.turn.input, Message.assistant("ok")], ending)
    kept = {"worker_id": "w1", "lease_ms": LEASE, "fence": first.fence}
    taken = await proto.acquire(CID, **kept)
    again = await proto.acquire(CID, **kept)  # the same acquire resent (its reply was lost)
    assert taken is not None and again is not None
    assert (again.turn.turn_id, again.fence, again.turn.attempts) == ("t2", first.fence, 1)
    assert [e.type for e in await _events(proto, "t2")] == ["status", "status"]  # queued, running


async def test_a_turn_handed_back_on_shutdown_says_worker_stopped_once(
    proto: TurnProtocol, r: redis.Redis
) -> None:
    await submit_all(proto, CID, "t1")
    first = await _take(proto)
    assert await proto.release(CID, "t1", fence=first.fence)
    second = await _take(proto, "w2")
    _lose(proto, r)
    third = await _take(proto, "w3")
    assert (second.turn.attempts, third.turn.attempts) == (2, 3)
    assert _resumed(await _events(proto)) == [
        {"reason": "worker_stopped", "attempt": 2},
        {"reason": "worker_lost", "attempt": 3},
    ]


async def test_a_parked_turn_resumes_with_the_attempt_that_parked_it(
    proto: TurnProtocol, r: redis.Redis
) -> None:
    await submit_all(proto, CID, "t1")
    await _park(proto, await _take(proto))
    assert await proto.decide(CID, "t1", call_id="call-1", approved=True) == "resume"
    resumed = await _take(proto, "w2")
    assert resumed.turn.attempts == 1
    assert (await proto.get_turn(CID, "t1")).attempts == 1
    events = await _events(proto)
    assert [e.type for e in events[-3:]] == ["decision", "status", "resumed"]
    assert events[-2].data == {"status": "running"}
    assert events[-1].data == {"reason": "approval_decided", "attempt": 1}
    # Parked again, nobody decides: the approval expires with the parked lease.
    await _park(proto, resumed)
    _lose(proto, r)
    expiring = await _take(proto, "w3")
    assert expiring.turn.attempts == 1 and expiring.turn.expired_ms is not None
    assert _resumed(await _events(proto))[-1] == {"reason": "approval_expired", "attempt": 1}


async def test_max_attempts_counts_the_lost_runs_across_a_park(
    proto: TurnProtocol, r: redis.Redis
) -> None:
    await submit_all(proto, CID, "t1", "t2")
    await _take(proto, max_attempts=2)
    _lose(proto, r)  # lost once before it parked
    await _park(proto, await _take(proto, max_attempts=2))
    await proto.decide(CID, "t1", call_id="call-1", approved=True)
    resumed = await _take(proto, max_attempts=2)
    assert resumed.turn.turn_id == "t1" and resumed.turn.attempts == 2
    _lose(proto, r)  # and once after: two lost runs, the most max_attempts=2 allows
    nxt = await _take(proto, max_attempts=2)
    assert nxt.turn.turn_id == "t2"
    record = await proto.get_turn(CID, "t1")
    assert record.status == "failed" and record.error is not None
    assert (record.error["type"], record.attempts) == ("MaxAttemptsExceededError", 2)


async def test_a_resume_never_puts_a_turn_over_max_attempts(proto: TurnProtocol) -> None:
    await submit_all(proto, CID, "t1")
    await _park(proto, await _take(proto, max_attempts=1))
    await proto.decide(CID, "t1", call_id="call-1", approved=False)
    resumed = await _take(proto, max_attempts=1)
    assert (resumed.turn.turn_id, resumed.turn.status, resumed.turn.attempts) == (
        "t1",
        "running",
        1,
    )


# -- real workers --------------------------------------------------------------------------
@pytest.fixture
def make_pool(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pools: list[WorkerPool] = []

    def make(**settings: object) -> WorkerPool:
        pool = WorkerPool(redis_server.url, tmp_path_factory.mktemp("resumed"), **settings)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.stop_all()
        for worker in pool.workers:
            worker.kill()


def _test_key(pool: WorkerPool, *parts: str) -> str:
    """A key the agents of tests.support.worker_agents read or write."""
    return ":".join([pool.prefix, "test", *parts])


@pytest.mark.slow
def test_a_worker_killed_mid_turn_leaves_a_resumed_event_in_the_stream(
    make_pool: Any, r: redis.Redis
) -> None:
    pool: WorkerPool = make_pool(lease_ms=3000, sweep_interval_s=0.5)
    [first] = pool.start(1)
    cid, word = f"killed-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:8]
    with pool.client() as client:
        turn = client.submit(cid, f"{word} survive", agent="blocker")
        ran = _test_key(pool, "ran", word)
        wait_until(lambda: r.llen(ran) == 1, 30, what="the model call")
        first.kill()
        r.set(_test_key(pool, "release", word), 1)  # the rerun's model call returns at once
        pool.start(1)
        result = turn.wait(60)
        assert result.text == f"released {word} survive" and result.attempts == 2
        events = list(turn.events(timeout=10))
        kinds = [(e.type, e.data.get("status") or e.data.get("reason")) for e in events]
        assert kinds[:3] == [
            ("status", "queued"),
            ("status", "running"),
            ("resumed", "worker_lost"),
        ]
        assert kinds[-1] == ("done", "succeeded")
        [resumed] = [e for e in events if e.type == "resumed"]
        assert resumed.data == {"reason": "worker_lost", "attempt": 2}


@pytest.mark.slow
def test_an_approved_turn_resumes_with_a_resumed_event_and_the_same_attempt(
    make_pool: Any,
) -> None:
    pool: WorkerPool = make_pool()
    pool.start(1)
    with pool.client() as client:
        parked = client.submit(f"approved-{uuid.uuid4().hex[:8]}", "pay", agent="approver")
        waiting = parked.wait(30)
        assert (waiting.status, waiting.attempts) == ("awaiting_approval", 1)
        client.approve(parked, waiting.pending_approvals[0].id)
        result = parked.wait(30)
        assert "after tool" in result.text and result.attempts == 1
        events = list(parked.events(timeout=10))
        [resumed] = [e for e in events if e.type == "resumed"]
        assert resumed.data == {"reason": "approval_decided", "attempt": 1}
        kinds = [e.type for e in events]
        at = kinds.index("resumed")
        assert kinds[at - 2 : at + 1] == ["decision", "status", "resumed"]
        assert "tool_result" in kinds[at:] and kinds[-1] == "done"

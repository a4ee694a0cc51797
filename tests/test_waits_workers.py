"""Waits for the world on real workers: a deferred call parks its turn until
``complete_call`` supplies the result, a signal wait until ``signal`` delivers one; both
resume on another worker after the one that parked them was SIGKILLed; a result posted
twice resumes once; a deadline passes and the model reads the error; a signal sent before
the wait is kept for it; cancelling a waiting turn frees its conversation."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from convoq.client import Client
from convoq.errors import ProtocolError
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool, module_pool, wait_until

AGENTS = "tests.support.world_agents"
pool = module_pool(1, agents=AGENTS)


def _order() -> str:
    return f"o{uuid.uuid4().hex[:10]}"


def _seen(r: redis.Redis, pool: WorkerPool, order: str) -> list[str]:
    return [v.decode() for v in r.lrange(f"{pool.prefix}:test:seen:{order}", 0, -1)]


def _runs(r: redis.Redis, pool: WorkerPool, order: str) -> list[str]:
    return [v.decode() for v in r.lrange(f"{pool.prefix}:test:runs:{order}", 0, -1)]


def _waiting(client: Client, cid: str, tid: str) -> None:
    wait_until(lambda: client.handle(cid, tid).status() == "waiting", 60, what="the turn waits")


def test_a_deferred_call_parks_and_resumes_once_with_the_result(
    pool: WorkerPool, redis_client: redis.Redis
) -> None:
    order, cid = _order(), f"c-{uuid.uuid4().hex[:8]}"
    with pool.client() as client:
        handle = client.submit(cid, f"ship {order}", agent="courier")
        _waiting(client, cid, handle.turn_id)
        record = handle.record()
        assert record.result is not None
        assert record.result["waits"] == {
            f"ship-{order}": {"on": "result", "name": None, "timeout_s": None,
                              "metadata": {"order": order}},
        }  # fmt: skip
        # No person decides it: the approvals inbox does not offer it.
        listed = [p for p in client.awaiting_approval() if p.record.turn_id == handle.turn_id]
        assert listed == []
        with pytest.raises(ProtocolError, match="waits for its result"):
            client.approve(handle, f"ship-{order}")
        assert client.complete_call(handle, f"ship-{order}", {"tracking": "T1"}) == "resume"
        # The same result again is kept (nothing sent); another one is refused.
        assert client.complete_call(handle, f"ship-{order}", {"tracking": "T1"}) == "resume"
        with pytest.raises(ProtocolError, match="already decided otherwise"):
            client.complete_call(handle, f"ship-{order}", {"tracking": "T2"})
        result = handle.wait(60)
        events = [e for e in handle.events(timeout=10)]
    assert result.status == "succeeded" and result.text == 'done: {"tracking":"T1"}'
    assert _seen(redis_client, pool, order) == ['{"tracking":"T1"}']
    assert _runs(redis_client, pool, order) == ["ship"]  # the tool ran once
    kinds = [e.type for e in events]
    assert kinds.count("deferred") == 1 and kinds.count("result_supplied") == 1
    assert [e.data["reason"] for e in events if e.type == "resumed"] == ["wait_done"]
    deferred = next(e for e in events if e.type == "deferred")
    assert deferred.data["on"] == "result" and deferred.data["metadata"] == {"order": order}


def test_an_error_result_is_what_the_model_reads(
    pool: WorkerPool, redis_client: redis.Redis
) -> None:
    order, cid = _order(), f"c-{uuid.uuid4().hex[:8]}"
    with pool.client() as client:
        handle = client.submit(cid, f"ship {order}", agent="courier")
        _waiting(client, cid, handle.turn_id)
        client.complete_call(handle, f"ship-{order}", error="carrier refused the parcel")
        assert handle.wait(60).text == "done: carrier refused the parcel"
    assert _seen(redis_client, pool, order) == ["carrier refused the parcel"]


def test_a_deadline_passes_and_the_model_reads_the_error(
    pool: WorkerPool, redis_client: redis.Redis
) -> None:
    order, cid = _order(), f"c-{uuid.uuid4().hex[:8]}"
    with pool.client() as client:
        handle = client.submit(cid, f"rush {order}", agent="courier")
        result = handle.wait(60)
        # Past the deadline a result is refused: the call ended with the error.
        with pytest.raises(ProtocolError):
            client.complete_call(handle, f"rush-{order}", "late")
        events = [e for e in handle.events(timeout=10)]
    error = "Error: no result for this tool call arrived before its deadline."
    assert result.status == "succeeded" and result.text == f"done: {error}"
    assert _seen(redis_client, pool, order) == [error]
    assert [e.data["reason"] for e in events if e.type == "resumed"] == ["wait_expired"]


def test_a_signal_wakes_the_turn_waiting_for_it_and_one_sent_before_is_kept(
    pool: WorkerPool, redis_client: redis.Redis
) -> None:
    order, cid = _order(), f"c-{uuid.uuid4().hex[:8]}"
    with pool.client() as client:
        first = client.submit(cid, f"pay {order}", agent="courier")
        _waiting(client, cid, first.turn_id)
        sent = client.signal(cid, "paid", {"amount": 12}, signal_id="evt-1")
        assert (sent.outcome, sent.call_id, sent.resume) == (
            "delivered",
            f"await_payment-{order}",
            True,
        )
        assert client.signal(cid, "paid", {"amount": 12}, signal_id="evt-1").outcome == "duplicate"
        assert first.wait(60).text == 'done: {"amount":12}'
        # Sent before the next wait: kept, and that wait takes it at once.
        assert client.signal(cid, "paid", {"amount": 30}).outcome == "kept"
        second = client.submit(cid, f"pay {order}", agent="courier").wait(60)
        events = [e.type for e in client.handle(cid, second.turn_id).events(timeout=10)]
    assert second.text == 'done: {"amount":30}'
    assert "signal_delivered" in events
    assert _seen(redis_client, pool, order) == ['{"amount":12}', '{"amount":30}']


def test_cancelling_a_waiting_turn_frees_the_conversation(pool: WorkerPool) -> None:
    order, cid = _order(), f"c-{uuid.uuid4().hex[:8]}"
    with pool.client() as client:
        handle = client.submit(cid, f"ship {order}", agent="courier")
        _waiting(client, cid, handle.turn_id)
        behind = client.submit(cid, f"ship {_order()}", agent="courier")
        assert behind.status() == "queued"  # it waits behind the parked turn
        assert client.cancel(handle) == "cancelled"
        _waiting(client, cid, behind.turn_id)
        client.cancel(behind)
        assert handle.status() == "cancelled"


@pytest.fixture
def lone_pool(redis_server: RedisServer, tmp_path: Path) -> Iterator[WorkerPool]:
    fresh = WorkerPool(redis_server.url, tmp_path, agents=AGENTS, lease_ms=3000)
    try:
        yield fresh
    finally:
        fresh.stop_all()


def test_waits_resume_on_another_worker_after_the_first_was_killed(
    lone_pool: WorkerPool, redis_client: redis.Redis
) -> None:
    order, cid = _order(), f"c-{uuid.uuid4().hex[:8]}"
    (first,) = lone_pool.start(1)
    with lone_pool.client() as client:
        handle = client.submit(cid, f"both {order}", agent="courier")
        _waiting(client, cid, handle.turn_id)
        first.kill()  # SIGKILL: the worker that parked it is gone
        lone_pool.start(1)  # another worker, which resumes it
        assert client.complete_call(handle, f"ship-{order}", "parcel left") == "pending"
        assert client.signal(cid, "paid", "ok").resume is True
        result = handle.wait(90)
        events = [e for e in handle.events(timeout=10)]
    assert result.text == "done: parcel left | ok"  # a str reads as it is
    assert _runs(redis_client, lone_pool, order) == ["ship", "await_payment"]
    workers = {e.data.get("worker") for e in events if e.type == "assistant"}
    assert len(workers) == 2, workers  # asked first on the killed worker, then the other
    assert _seen(redis_client, lone_pool, order) == ["parcel left", "ok"]

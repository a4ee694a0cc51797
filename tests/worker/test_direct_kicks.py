"""Drain kicks that find a free slot start on the worker's loop without Celery's pool
(:mod:`convoq.worker._direct`), and are still acknowledged only after their drain; with
the fast paths off every kick goes through the pool. Real worker processes."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from convoq.settings import fast_paths
from tests.support.direct_agents import pool_tasks_key
from tests.support.workers import WorkerPool

# Run again with the fast paths off by `make test-slowpaths`.
pytestmark = pytest.mark.slowpaths


@pytest.fixture
def pool(redis_url: str, tmp_path: Path) -> Iterator[WorkerPool]:
    workers = WorkerPool(redis_url, tmp_path, agents="tests.support.direct_agents")
    workers.start()
    yield workers
    workers.stop_all()


def test_a_kick_for_a_free_slot_is_run_without_celerys_pool(
    pool: WorkerPool, redis_client: redis.Redis
) -> None:
    with pool.client() as client:
        for n in range(3):
            assert client.submit(f"d{n}-{uuid.uuid4().hex[:6]}", "hi", agent="quick").wait(30).ok
    ran = [name.decode() for name in redis_client.lrange(pool_tasks_key(pool.prefix), 0, -1)]
    if fast_paths():
        assert "convoq.drain" not in ran
    else:
        assert ran.count("convoq.drain") >= 3  # a duplicate kick may add an idle drain


def _held_kicks(r: redis.Redis, cid: str) -> int:
    """Kicks of ``cid`` kombu's Redis transport holds unacknowledged."""
    return sum(cid in json.loads(raw)[0]["headers"]["argsrepr"] for raw in r.hvals("unacked"))


def test_a_kick_is_acknowledged_only_after_its_drain(
    pool: WorkerPool, redis_client: redis.Redis
) -> None:
    if fast_paths():
        # kombu keeps unacked notes only with its ack emulation, which the fast paths turn
        # off (a kick is a hint; the sweeper re-kicks): nothing to observe on Redis then.
        pytest.skip("the Redis broker keeps no unacked note with the fast paths on")
    cid = f"held-{uuid.uuid4().hex[:6]}"
    with pool.client() as client:
        handle = client.submit(cid, "hi", agent="slow")
        deadline = time.monotonic() + 10
        while handle.status() != "running" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert handle.status() == "running"
        assert _held_kicks(redis_client, cid) == 1
        assert handle.wait(30).ok
    deadline = time.monotonic() + 10
    while _held_kicks(redis_client, cid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _held_kicks(redis_client, cid) == 0

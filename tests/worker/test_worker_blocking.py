"""Blocking user code in a worker: sync model functions and sync tools run with as much
concurrency as the worker is configured for, not asyncio's default executor's few threads."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis

from tests.support.redis_server import RedisServer
from tests.support.workers import running_pool

pytestmark = pytest.mark.slow

# More than asyncio's default executor has threads (at most 32) and than the pool for
# blocking code has outside a worker: only a pool sized to the concurrency runs them all.
N = 40


def _spans(r: redis.Redis, prefix: str, group: str, phase: str) -> list[tuple[float, float]]:
    raw = r.lrange(f"{prefix}:test:spans:{group}:{phase}", 0, -1)
    return [(float(a), float(b)) for a, b in (item.decode().split() for item in raw)]


def test_n_slow_sync_models_and_tools_run_at_once_on_one_worker(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    group = uuid.uuid4().hex[:8]
    r = redis.Redis.from_url(redis_server.url)
    with running_pool(redis_server.url, tmp_path, 1, concurrency=N) as pool, pool.client() as c:
        handles = [
            c.submit(f"meet-{group}-{i}", f"{group} {N}", agent="rendezvous") for i in range(N)
        ]
        results = [h.wait(120) for h in handles]
    assert all(result.text == "after tool: met" for result in results)
    for phase in ("model", "tool"):
        spans = _spans(r, pool.prefix, group, phase)
        assert len(spans) == N
        # Every call started before any of them ended: all N ran at the same time.
        assert max(start for start, _ in spans) < min(end for _, end in spans), phase
    r.close()

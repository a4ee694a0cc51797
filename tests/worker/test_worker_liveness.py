"""A worker killed with SIGKILL is reported dead (``alive: False``, ``last_seen``) once it
missed a few heartbeats, and then drops out of ``Client.workers()``; the bounds are
multiples of each worker's own heartbeat period (its sweep period)."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis import Redis

from convoq.redis import _registry
from convoq.redis.keys import KeySchema
from tests.support.redis_server import RedisServer
from tests.support.workers import running_pool, wait_until

pytestmark = pytest.mark.slow

HEARTBEAT_S = 0.5
STALE = getattr(_registry, "STALE_HEARTBEATS", 3)
DROP = getattr(_registry, "DROP_HEARTBEATS", 12)


def test_a_killed_worker_is_reported_dead_then_dropped(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    with running_pool(redis_server.url, tmp_path, 2, sweep_interval_s=HEARTBEAT_S) as pool:
        victim, survivor = pool.workers
        with pool.client() as client:
            listed = wait_until(
                lambda: (w := client.workers()) and all(i["alive"] for i in w.values()) and w,
                30,
                what="both workers alive",
            )
            assert set(listed) == {victim.name, survivor.name}
            assert listed[victim.name]["heartbeat_ms"] == int(HEARTBEAT_S * 1000)
            victim.kill()  # SIGKILL: it withdraws nothing
            dead = wait_until(
                lambda: (i := client.workers().get(victim.name)) and not i["alive"] and i,
                30,
                what="the killed worker reported dead",
            )
            assert dead["last_seen"] and dead["last_seen_s"] >= STALE * HEARTBEAT_S
            wait_until(
                lambda: victim.name not in client.workers(), 60, what="the killed worker dropped"
            )
            wait_until(
                lambda: client.workers().get(survivor.name, {}).get("alive"),
                30,
                what="the survivor alive",
            )
        # Gone from the registry itself, not only from the list; the survivor stays.
        key = KeySchema(pool.prefix).workers()
        store = Redis.from_url(redis_server.url)
        try:
            assert not store.hexists(key, victim.name) and store.hexists(key, survivor.name)
        finally:
            store.close()


@pytest.mark.parametrize(
    ("missed_ms", "alive", "listed"),
    [
        (0, True, True),
        (STALE * 1000, True, True),
        (STALE * 1000 + 1, False, True),
        (DROP * 1000, False, True),
        (DROP * 1000 + 1, False, False),
    ],
)
def test_liveness_bounds_are_multiples_of_the_workers_own_heartbeat(
    missed_ms: int, alive: bool, listed: bool
) -> None:
    seen = 1_700_000_000_000
    entry = {"seen_ms": seen, "heartbeat_ms": 1000, "pid": 7}
    # The reader's own period (here 60 s) counts only for an entry that records none.
    judged_entry = _registry.judged(entry, seen + missed_ms, 60_000)
    assert (judged_entry is not None) is listed
    if judged_entry is not None:
        assert judged_entry["alive"] is alive and judged_entry["pid"] == 7
        assert judged_entry["last_seen"] == "2023-11-14T22:13:20.000+00:00"
    # An entry of a worker that records no period is judged by the reader's.
    older = _registry.judged({"seen_ms": seen}, seen + missed_ms, 1000)
    assert (older is not None) is listed
    assert older is None or older["alive"] is alive

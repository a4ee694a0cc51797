"""Scheduled turns on real worker processes whose store is the 3-primary Redis Cluster (the
broker is the standalone test redis-server): turns scheduled on conversations on every
primary run once each, in due order, never before their due time; a tool's
``ctx.schedule`` follow-up runs; the workers' metrics count the timers fired, their lag
and the turns waiting."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster

from convoq.client import Client, TurnHandle
from convoq.errors import TurnCancelledError
from tests.support.redis_cluster import RedisClusterNodes
from tests.support.redis_server import RedisServer
from tests.support.telemetry import Samples, scrape, value
from tests.support.workers import WorkerPool, running_pool, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool(
    redis_cluster: RedisClusterNodes,
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerPool]:
    logs = tmp_path_factory.mktemp("cluster-timer-workers")
    settings = {
        "agents": "tests.support.schedule_agents",
        "broker_url": redis_server.url,
        "partitions": 2,
        "timer_interval_s": 0.2,
        "sweep_interval_s": 0.5,
        "metrics_port": 0,
        "metrics_host": "127.0.0.1",
    }
    with running_pool(redis_cluster.url, logs, 2, **settings) as started:
        yield started


@pytest.fixture
def test_data(redis_cluster: RedisClusterNodes) -> Iterator[RedisCluster]:
    client = redis_cluster.client()
    yield client
    client.close()


def _ran(test_data: RedisCluster, pool: WorkerPool, cid: str) -> list[tuple[str, int]]:
    """The turns ``stamp`` ran in ``cid``: (message, Redis ms when it ran)."""
    found = []
    for raw in test_data.lrange(f"{pool.prefix}:test:ran:{cid}", 0, -1):
        said, _, ms = raw.decode().rpartition("@")
        found.append((said, int(ms)))
    return found


def _scrapes(client: Client) -> list[Samples]:
    return [scrape(int(info["metrics_port"])) for info in client.workers().values()]


def _total(scrapes: list[Samples], name: str) -> float:
    """A counter summed over the workers (``convoq_timer_lag_bucket_10``: the lags of
    10 s or less, polled every 0.2 s here)."""
    if name == "convoq_timer_lag_bucket_10":
        return sum(value(s, "convoq_timer_lag_seconds_bucket", le="10.0") for s in scrapes)
    return sum(value(s, name) for s in scrapes)


def _waiting(scrapes: list[Samples], partitions: int) -> float:
    """``sum(max by (partition) (convoq_timers_waiting))`` over the workers' scrapes."""
    return sum(
        max(value(s, "convoq_timers_waiting", partition=str(p)) for s in scrapes)
        for p in range(partitions)
    )


def test_scheduled_turns_on_every_primary_run_once_in_due_order(
    pool: WorkerPool, redis_cluster: RedisClusterNodes, test_data: RedisCluster
) -> None:
    cids = redis_cluster.conversations_on_every_primary(pool.prefix, 2)
    with pool.client() as client:
        before = _scrapes(client)
        parked: list[TurnHandle] = []
        for cid in cids:  # waiting for an hour: counted by the sweeps while they wait
            parked.append(client.submit(cid, f"{cid}|parked", agent="stamp", delay_s=3600))
        wait_until(
            lambda: _waiting(_scrapes(client), pool.partitions) == len(cids),
            30,
            what="a sweep to count the turns waiting on a timer",
        )
        handles: dict[str, list[TurnHandle]] = {}
        for cid in cids:  # submitted last, due first
            second = client.submit(cid, f"{cid}|second", agent="stamp", delay_s=2)
            first = client.submit(cid, f"{cid}|first", agent="stamp", delay_s=1)
            handles[cid] = [first, second]
        for cid in cids:
            results = [h.wait(60, until="final") for h in handles[cid]]
            assert [r.text for r in results] == [f"ran {cid}|first", f"ran {cid}|second"]
            ran = _ran(test_data, pool, cid)
            assert [said for said, _ in ran] == [f"{cid}|first", f"{cid}|second"]  # once each
            for handle, (_, ran_ms) in zip(handles[cid], ran, strict=True):
                record = handle.record()
                assert record.due_ms is not None and record.fired_ms is not None
                assert record.fired_ms >= record.due_ms and ran_ms >= record.due_ms
        fired, name = 2 * len(cids), "convoq_timers_fired_total"
        # Each timer fired once across the two workers: the counts add up exactly.
        wait_until(
            lambda: _total(_scrapes(client), name) - _total(before, name) == fired,
            10,
            what="the fired timers to be counted",
        )
        after = _scrapes(client)
        for name in ("convoq_timer_lag_seconds_count", "convoq_timer_lag_bucket_10"):
            assert _total(after, name) - _total(before, name) == fired, name
        for handle in parked:
            assert client.cancel(handle) == "cancelled"
            with pytest.raises(TurnCancelledError):
                handle.wait(5, until="final")
        wait_until(
            lambda: _waiting(_scrapes(client), pool.partitions) == 0,
            30,
            what="a sweep to see no turn waiting",
        )
        assert all(client.scheduled(cid) == [] for cid in cids)


def test_a_ctx_schedule_follow_up_runs_on_every_primary(
    pool: WorkerPool, redis_cluster: RedisClusterNodes, test_data: RedisCluster
) -> None:
    cids = redis_cluster.conversations_on_every_primary(pool.prefix, 1)
    with pool.client() as client:
        handles = [client.submit(cid, "remind me", agent="follow_up") for cid in cids]
        for cid, handle in zip(cids, handles, strict=True):
            text = handle.wait(30).text
            assert text.startswith("scheduled ")
            reminder = client.handle(cid, text.split()[1])
            assert reminder.wait(30, until="final").text == "ran reminder"
            scheduled = test_data.lrange(f"{pool.prefix}:test:scheduled:{cid}", 0, -1)
            assert [t.decode() for t in scheduled] == [reminder.turn_id]  # scheduled once

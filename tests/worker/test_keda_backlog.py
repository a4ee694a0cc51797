"""What deploy/k8s/keda.yaml scales on, read off real workers holding a backlog: the
queued turns themselves (the inbox depth metric, through KEDA's Prometheus trigger), not
the Celery queues, which hold one kick per conversation and which workers drain into their
slots however many turns wait."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from convoq.client import Client, TurnHandle
from convoq.queue.routing import queue_name
from tests.support.redis_server import RedisServer
from tests.support.telemetry import Samples, scrape
from tests.support.workers import WorkerPool, running_pool, wait_until

pytestmark = pytest.mark.slow

KEDA = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "keda.yaml"
CONVERSATIONS = 6
TURNS_EACH = 5


@pytest.fixture
def pool(redis_server: RedisServer, tmp_path: Path) -> Iterator[WorkerPool]:
    # Two workers, as replicas: one sweeps and reports the depth, the other clears its own.
    with running_pool(
        redis_server.url, tmp_path, 2, metrics_port=0, sweep_interval_s=0.5
    ) as started:
        yield started


def trigger_query() -> str:
    (query,) = re.findall(r"^\s*query: (.+)$", KEDA.read_text(), re.MULTILINE)
    return query.strip()


def what_the_trigger_reads(scrapes: list[Samples]) -> float:
    """``sum(max by (partition) (convoq_inbox_depth))`` over the workers' scrapes."""
    deepest: dict[str, float] = {}
    for samples in scrapes:
        for (name, labels), depth in samples.items():
            if name == "convoq_inbox_depth":
                partition = dict(labels)["partition"]
                deepest[partition] = max(deepest.get(partition, 0.0), depth)
    return sum(deepest.values())


def kick_list_lengths(r: redis.Redis, pool: WorkerPool) -> int:
    """What the former trigger read: the lengths of the partitions' Celery queues."""
    return sum(int(r.llen(queue_name(pool.prefix, p))) for p in range(pool.partitions))


def test_the_autoscaler_reads_the_queued_turns_not_the_kicks(
    pool: WorkerPool, redis_server: RedisServer
) -> None:
    assert trigger_query() == "sum(max by (partition) (convoq_inbox_depth))"
    assert "type: prometheus" in KEDA.read_text() and "listName" not in KEDA.read_text()
    r = redis.Redis.from_url(redis_server.url)
    with pool.client() as client:
        ports = [int(info["metrics_port"]) for info in client.workers().values()]
        assert len(ports) == 2
        words = [f"k{uuid.uuid4().hex[:8]}" for _ in range(CONVERSATIONS)]
        handles = backlog(client, words)
        try:
            backlog_size = CONVERSATIONS * TURNS_EACH
            # Every conversation's first turn runs (blocked in its model call): the kicks
            # are all taken, the turns all wait.
            wait_until(
                lambda: all(r.llen(f"{pool.prefix}:test:ran:{w}") for w in words),
                what="every conversation's first turn to run",
            )
            reads = wait_until(
                lambda: (
                    (n := what_the_trigger_reads([scrape(p) for p in ports])) == backlog_size and n
                ),
                what="the sweep to report the backlog",
            )
            assert reads == backlog_size
            kicks = kick_list_lengths(r, pool)
            assert kicks < backlog_size  # what the queues would say
        finally:
            for word in words:
                r.set(f"{pool.prefix}:test:release:{word}", "1")
        for handle in handles:
            handle.wait(60)
        wait_until(
            lambda: what_the_trigger_reads([scrape(p) for p in ports]) == 0 or None,
            what="the depth to fall back to 0",
        )
    r.close()


def backlog(client: Client, words: list[str]) -> list[TurnHandle]:
    """A blocking first turn per conversation, then the rest queued behind it."""
    handles = []
    for word in words:
        cid = f"keda-{word}"
        handles.append(client.submit(cid, f"{word} first", agent="blocker"))
        for n in range(TURNS_EACH - 1):
            handles.append(client.submit(cid, f"{word} then {n}", agent="echo"))
    return handles

"""Chaos: redis-server (or a Redis Cluster primary) killed with -9 while turns run,
restarted from its AOF. Nothing a client was told is queued may be lost, nothing may be
stored twice, and order holds.

When its Redis broker connection drops, a Celery 5.x worker may exit ("Unrecoverable
error" inside kombu's reconnect); deployments run workers under a supervisor that starts
them again (systemd Restart=always, Kubernetes, compose restart policies). The test plays
that supervisor: it restarts exited workers, as production would, and nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from redis.crc import key_slot

from convoq import Client
from convoq.messages import MessageRole
from tests.support import services
from tests.support.rabbitmq import AMQP_URL, delete_amqp_queues
from tests.support.redis_cluster import RedisClusterNodes
from tests.support.redis_server import RedisServer
from tests.support.workers import running_pool, supervised, wait_until

# Run again with the fast paths off by `make test-slowpaths`.
pytestmark = [pytest.mark.slow, pytest.mark.slowpaths]

CONVERSATIONS, TURNS = 6, 5


@pytest.mark.parametrize("store", ["redis", "redis-cluster", "redis-cluster+rabbitmq"])
def test_redis_killed_mid_run_loses_and_duplicates_nothing(store: str, tmp_path: Path) -> None:
    with _store(store, tmp_path) as (url, broker_url, outage), running_pool(
        url, tmp_path, 2, agents="tests.support.chaos_agents",
        lease_ms=2000, sweep_interval_s=0.5, broker_url=broker_url,
    ) as pool, pool.client() as client, supervised(pool):  # fmt: skip
        _run_through_an_outage(outage, client)
    if broker_url == AMQP_URL:
        delete_amqp_queues(pool)


# The store's URL, the broker's (None: the store) and the outage: kill -9, then restart.
Store = tuple[str, str | None, Callable[[], None]]


@contextmanager
def _store(kind: str, tmp_path: Path) -> Iterator[Store]:
    """One redis-server that is also the broker and is killed; or a Redis Cluster (its
    AOF fsynced always) whose primary serving the first conversation is killed, with a
    broker that stays up (a standalone Redis, or RabbitMQ). The node comes back before a
    replica would take over: failover is not what this test is about."""
    if kind == "redis":
        server = RedisServer(tmp_path / "redis")
        server.start()
        try:
            yield server.url, None, lambda: _kill_and_restart(server.kill, server.start)
        finally:
            server.stop()
        return
    cli = services.redis_cli()
    if kind.endswith("rabbitmq"):
        services.rabbitmq()
    cluster = RedisClusterNodes(
        tmp_path / "cluster", cli, appendfsync="always", node_timeout_ms=15_000
    )
    broker = RedisServer(tmp_path / "broker")
    try:
        cluster.start()
        if not kind.endswith("rabbitmq"):
            broker.start()
        port = cluster.slot_owner(key_slot(b"chaos-0"))
        outage = lambda: _kill_and_restart(  # noqa: E731
            lambda: cluster.kill(port), lambda: cluster.restart(port)
        )
        yield cluster.url, AMQP_URL if broker.process is None else broker.url, outage
    finally:
        broker.stop()
        cluster.stop()


def _kill_and_restart(kill: Callable[[], None], start: Callable[[], None]) -> None:
    kill()
    time.sleep(1.0)
    start()


def _run_through_an_outage(outage: Callable[[], None], client: Client) -> None:
    handles = {
        f"chaos-{c}": [
            client.submit(f"chaos-{c}", f"c{c} t{t}", agent="slow_echo") for t in range(TURNS)
        ]
        for c in range(CONVERSATIONS)
    }
    # Kill while turns are in flight: some done, most still queued or running.
    wait_until(lambda: any(hs[0].status() == "succeeded" for hs in handles.values()),
               30, what="a first turn")  # fmt: skip
    outage()
    for c in range(CONVERSATIONS):
        cid = f"chaos-{c}"
        results = [h.wait(90) for h in handles[cid]]
        assert [r.status for r in results] == ["succeeded"] * TURNS, cid
        users = [m.text for m in client.history(cid) if m.role == MessageRole.USER]
        assert users == [f"c{c} t{t}" for t in range(TURNS)], cid  # once, in order
        assert results[-1].text == "seen: " + " | ".join(users), cid

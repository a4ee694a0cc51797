"""Half-open connections are noticed within the bounds convoq sets on every Redis and
broker connection (:mod:`convoq._connection_bounds`): a loopback proxy stops passing bytes
on the connections open through it without closing them (as a NAT or firewall that forgot
them would), while new connections pass; then it swallows new ones too (a partition).

Without socket timeouts a call on such a connection waits for ever. With them:

- a client call goes through on a new connection within twice the socket timeout (the
  fast path's kept connection, then redis-py's pooled one, may each be dead);
- with the network gone it raises RedisUnavailableError within three socket timeouts
  (the fast path's, then redis-py's resends within twice the timeout);
- a worker holding a turn renews its lease again, commits the turn, and its consumer
  (kombu's BRPOP connection, dropped by kombu's health check) takes new kicks.

The times are printed (the test asserts them against the documented bound, with slack for
a loaded machine).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from convoq._connection_bounds import ConnectionBounds
from convoq.client import AsyncClient, Client
from convoq.errors import RedisUnavailableError
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import Message
from convoq.redis.keys import KeySchema
from convoq.settings import ConvoqSettings
from tests.support.half_open import SilentProxy
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool, wait_until

pytestmark = pytest.mark.slow

LEASE_MS = 8000
# Socket, connect and health-check bounds of a quarter of a lease (2 s), the WAIT below.
ACK_MS = 500
# What a loaded machine (two cores shared by parallel tests) may add to a bound.
SLACK_S = 3.0


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[SilentProxy]:
    forwarder = SilentProxy(redis_server.port)
    yield forwarder
    forwarder.close()


def _bounds() -> ConnectionBounds:
    bounds = ConnectionBounds.of(
        ConvoqSettings.resolve(lease_ms=LEASE_MS, replica_ack_timeout_ms=ACK_MS)
    )
    assert bounds.socket_timeout_s == bounds.connect_timeout_s == LEASE_MS / 4000
    return bounds


async def _timed(
    call: asyncio.Future[object] | object, limit_s: float = 60
) -> tuple[object, float]:
    started = time.monotonic()
    result = await asyncio.wait_for(call, limit_s)  # type: ignore[arg-type]
    return result, time.monotonic() - started


async def test_a_client_call_on_a_half_open_connection_goes_through_on_a_new_one(
    proxy: SilentProxy,
    redis_server: RedisServer,
    key_prefix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    timeout_s = _bounds().socket_timeout_s
    assert timeout_s is not None
    settings = ConvoqSettings.resolve(
        redis_url=proxy.url(),
        broker_url=redis_server.url,
        prefix=key_prefix,
        lease_ms=LEASE_MS,
        replica_ack_timeout_ms=ACK_MS,
    )
    cid = f"half-{uuid.uuid4().hex[:8]}"
    async with AsyncClient(settings=settings) as client:
        # Several connections open through the proxy (calls at once), then idle.
        await asyncio.gather(*(client.history(cid) for _ in range(8)))
        assert proxy.silence() >= 2
        history, recovered_s = await _timed(client.history(cid))
        assert history == []
        # The timeout closed the other idle connections too: the next call opens a new one
        # at once instead of meeting another dead one.
        _, next_s = await _timed(client.history(cid))
        proxy.blackhole()
        started = time.monotonic()
        with pytest.raises(RedisUnavailableError):
            await asyncio.wait_for(client.history(cid), 60)
        raised_s = time.monotonic() - started
        proxy.restore()
        _, back_s = await _timed(client.history(cid))
    with capsys.disabled():
        print(
            f"\nhalf-open, client (socket timeout {timeout_s:g}s): a call went through on a new"
            f" connection in {recovered_s:.2f}s (the next in {next_s:.2f}s); with the network"
            f" gone it raised in"
            f" {raised_s:.2f}s; once restored it went through in {back_s:.2f}s"
        )
    assert recovered_s < 2 * timeout_s + SLACK_S
    assert next_s < timeout_s / 2
    assert raised_s < 3 * timeout_s + SLACK_S


def test_a_sync_memory_call_on_a_half_open_connection_goes_through(
    proxy: SilentProxy, key_prefix: str
) -> None:
    timeout_s = _bounds().socket_timeout_s
    assert timeout_s is not None
    memory = RedisConversationMemory(url=proxy.url(), prefix=key_prefix, lease_ms=LEASE_MS)
    try:
        memory.append("m", [Message.user("hi"), Message.assistant("hello")])
        assert proxy.silence() >= 1
        started = time.monotonic()
        assert [m.text for m in memory.load("m")] == ["hi", "hello"]
        assert time.monotonic() - started < 2 * timeout_s + SLACK_S
    finally:
        memory.close()


@pytest.fixture
def pool(proxy: SilentProxy, tmp_path: Path) -> Iterator[WorkerPool]:
    """One worker reaching Redis (store and broker) only through the proxy."""
    flags = tmp_path / "flags"
    flags.mkdir()
    started = WorkerPool(
        proxy.url(),
        tmp_path / "logs",
        agents="tests.support.network_agents",
        lease_ms=LEASE_MS,
        replica_ack_timeout_ms=ACK_MS,
        concurrency=4,
    )
    started.env["CONVOQ_TEST_FLAGS"] = str(flags)
    try:
        started.start(1)
        yield started
    finally:
        started.stop_all()


def _lease_left_ms(r: redis.Redis, key: str) -> tuple[int, int]:
    """The lease's expiry and how long it has left by Redis's clock (ms)."""
    value = r.hget(key, "expires_ms")
    seconds, micros = r.time()
    expires = int(value) if value else 0
    return expires, expires - (seconds * 1000 + micros // 1000)


def test_a_worker_renews_commits_and_consumes_again_after_its_connections_go_half_open(
    pool: WorkerPool,
    proxy: SilentProxy,
    redis_server: RedisServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    flags = Path(pool.env["CONVOQ_TEST_FLAGS"])
    cid = f"held-{uuid.uuid4().hex[:8]}"
    lease = KeySchema(pool.prefix).lease(cid)
    r = redis.Redis.from_url(redis_server.url)
    client = Client(
        redis_server.url, prefix=pool.prefix, partitions=pool.partitions, agents=["waiter", "echo"]
    )
    try:
        held = client.submit(cid, "hold please", agent="waiter")
        wait_until(lambda: held.status() == "running", 30, what="the turn to start")
        time.sleep(LEASE_MS / 1000)  # renewals ran: their connections are open now
        before, _ = _lease_left_ms(r, lease)
        assert proxy.silence() >= 2
        silenced = time.monotonic()
        # A kick now: the consumer's own connection (kombu's BRPOP) is silent too.
        later = client.submit(f"later-{uuid.uuid4().hex[:8]}", "hello", agent="echo")
        renewed_s: float | None = None
        consumed_s: float | None = None
        least_left_ms = LEASE_MS
        while time.monotonic() < silenced + 2 * LEASE_MS / 1000:
            expires, left = _lease_left_ms(r, lease)
            least_left_ms = min(least_left_ms, left)
            if renewed_s is None and expires > before:
                renewed_s = time.monotonic() - silenced
            if consumed_s is None and later.status() == "succeeded":
                consumed_s = time.monotonic() - silenced
            time.sleep(0.05)
        assert later.wait(30).ok, pool.logs()
        (flags / "hold").touch()
        released = time.monotonic()
        result = held.wait(30)
        committed_s = time.monotonic() - released
    finally:
        client.close()
        r.close()
    with capsys.disabled():
        print(
            f"\nhalf-open, worker (lease {LEASE_MS} ms): the lease renewed again"
            f" {renewed_s or -1:.2f}s after the silence, never closer than {least_left_ms} ms"
            f" to lapsing; a turn kicked at the silence finished {consumed_s or -1:.2f}s"
            f" after it; the held turn, released, committed in {committed_s:.2f}s (attempts"
            f" {result.attempts})"
        )
    assert result.ok and result.text == "released hold please", pool.logs()
    # The worker kept the turn: its lease never lapsed, its run was never taken over.
    assert result.attempts == 1 and least_left_ms > 0, pool.logs()
    assert renewed_s is not None and renewed_s < LEASE_MS / 1000
    # kombu drops a BRPOP connection whose reply is a health-check interval overdue.
    health_s = _bounds().health_check_interval_s
    assert consumed_s is not None and health_s is not None
    assert consumed_s < 1 + 2 * health_s + SLACK_S

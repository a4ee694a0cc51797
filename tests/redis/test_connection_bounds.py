"""The bounds of every Redis and broker connection (:mod:`convoq._connection_bounds`): what
the settings give by default, that a URL option wins over its bound and an explicit
argument over the URL, and that every entry point (client, worker, memory, broker) opens
its connections with them."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from convoq._connection_bounds import ConnectionBounds
from convoq.client import AsyncClient
from convoq.memory.redis import RedisConversationMemory
from convoq.redis import connect
from convoq.redis._cluster import connection_option
from convoq.redis._sync_client import connect_blocking
from convoq.settings import ConvoqSettings
from convoq.worker._event_loop import WorkerLoop
from convoq.worker.app import create_app
from tests.support.redis_server import RedisServer


def _of(**settings: object) -> ConnectionBounds:
    return ConnectionBounds.of(ConvoqSettings.model_validate(settings))


def test_by_default_each_bound_is_a_quarter_of_a_lease() -> None:
    default = ConnectionBounds.default()
    assert default == ConnectionBounds(2.5, 2.5, 2.5, keepalive=True)
    assert default.retry_budget_s == 5.0
    assert _of(lease_ms=20_000) == ConnectionBounds(5.0, 5.0, 5.0)
    # Never under a second; a reply never shorter than the replicas' WAIT and a second.
    assert _of(lease_ms=1000) == ConnectionBounds(2.0, 1.0, 1.0)
    assert _of(lease_ms=1000, replica_ack_timeout_ms=100).socket_timeout_s == 1.1


def test_settings_set_each_bound_and_0_turns_it_off() -> None:
    given = _of(redis_socket_timeout_s=7, redis_connect_timeout_s=3,
                redis_health_check_interval_s=0, redis_socket_keepalive=False)  # fmt: skip
    assert given == ConnectionBounds(7, 3, None, keepalive=False)
    unbounded = _of(redis_socket_timeout_s=0)
    assert unbounded.socket_timeout_s is None and unbounded.retry_budget_s is None
    assert "socket_timeout" not in unbounded.redis_options(tcp=True)
    assert "socket_keepalive_options" not in given.redis_options(tcp=True)
    assert given.redis_options(tcp=False) == {"socket_timeout": 7}


def test_keepalive_probes_after_one_socket_timeout_then_every_half() -> None:
    options = ConnectionBounds(10, 5, 5).keepalive_options()
    assert options[socket.TCP_KEEPIDLE] == 10
    assert options[socket.TCP_KEEPINTVL] == 5
    assert options[socket.TCP_KEEPCNT] == 2


def test_the_variables_are_read_like_every_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVOQ_REDIS_SOCKET_TIMEOUT_S", "4")
    monkeypatch.setenv("CONVOQ_REDIS_SOCKET_KEEPALIVE", "off")
    bounds = ConnectionBounds.of(ConvoqSettings.resolve())
    assert (bounds.socket_timeout_s, bounds.keepalive) == (4, False)


async def test_the_url_wins_over_the_bounds_and_an_argument_over_the_url(
    redis_url: str,
) -> None:
    bounds = ConnectionBounds(3, 2, 4)
    plain = connect(redis_url, bounds=bounds)
    from_url = connect(f"{redis_url}?socket_timeout=9&socket_keepalive=false", bounds=bounds)
    given = connect(f"{redis_url}?socket_timeout=9", bounds=bounds, socket_timeout=11)
    try:
        options = plain.connection_pool.connection_kwargs
        assert (options["socket_timeout"], options["socket_connect_timeout"]) == (3, 2)
        assert options["health_check_interval"] == 4 and options["socket_keepalive"] is True
        assert options["socket_keepalive_options"] == bounds.keepalive_options()
        assert await plain.ping()
        url_options = from_url.connection_pool.connection_kwargs
        assert (url_options["socket_timeout"], url_options["socket_keepalive"]) == (9, False)
        assert connection_option(given, "socket_timeout") == 11
    finally:
        for client in (plain, from_url, given):
            await client.aclose()
    sync = connect_blocking(redis_url, bounds=bounds)
    try:
        assert sync.connection_pool.connection_kwargs["socket_timeout"] == 3
        assert sync.ping()
    finally:
        sync.close()


def test_a_unix_socket_gets_no_tcp_options() -> None:
    client = connect_blocking("unix:///tmp/no-such.sock?db=0", bounds=ConnectionBounds(3, 2, 4))
    options = client.connection_pool.connection_kwargs
    assert options["socket_timeout"] == 3
    assert not {"socket_keepalive", "socket_connect_timeout"} & set(options)
    client.close()


@pytest.fixture
def bounded_env(monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer) -> str:
    monkeypatch.setenv("CONVOQ_REDIS_SOCKET_TIMEOUT_S", "6.5")
    monkeypatch.setenv("CONVOQ_REDIS_HEALTH_CHECK_INTERVAL_S", "3")
    return redis_server.url


async def test_every_entry_point_opens_its_connections_with_the_settings(
    bounded_env: str, key_prefix: str, tmp_path: Path
) -> None:
    async with AsyncClient(bounded_env, prefix=key_prefix) as client:
        assert connection_option(client.protocol.redis, "socket_timeout") == 6.5
        sender = client._sender().conf  # the client's kicks
        assert sender.broker_transport_options["socket_timeout"] == 6.5
    memory = RedisConversationMemory(url=bounded_env, prefix=key_prefix)
    try:
        await memory.aload("c")
        memory.load("c")
        [loop] = memory._loops.loops()
        protocol = memory._loops._opened[loop].protocol
        assert connection_option(protocol.redis, "health_check_interval") == 3
        assert memory._blocking is not None
        assert memory._blocking.client.connection_pool.connection_kwargs["socket_timeout"] == 6.5
    finally:
        await memory.aclose()
    settings = ConvoqSettings.resolve(redis_url=bounded_env, prefix=key_prefix)
    app = create_app(settings)
    assert app.conf.broker_transport_options["socket_timeout"] == 6.5
    assert app.conf.broker_transport_options["health_check_interval"] == 3
    loop = WorkerLoop(settings, bounded_env, lambda protocol: None)  # type: ignore[arg-type,return-value]
    try:
        opened = loop.open()
        assert connection_option(opened.redis, "socket_timeout") == 6.5
    finally:
        loop.thread.run(loop.close_connections())
        loop.thread.stop()

"""Every redis-py option of a Redis URL works for the broker as for the store: kombu takes
none in the URL (it raised ``TypeError: Connection._init_params() got an unexpected
keyword argument 'socket_timeout'`` at the worker's start, and failed every client
``send_task``), so convoq hands them to kombu as transport options."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu.transport.redis import Channel, SentinelChannel

from convoq._connection_bounds import ConnectionBounds
from convoq.errors import ConfigurationError
from convoq.queue._broker import KOMBU_OPTIONS, broker_for
from convoq.queue.transport import celery_base_config, sender_app
from convoq.redis.keys import KeySchema
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool

OPTIONS = "socket_timeout=7&socket_connect_timeout=3&health_check_interval=4"


def test_every_option_named_for_kombu_is_a_transport_option_kombu_takes() -> None:
    assert set(KOMBU_OPTIONS) <= set(Channel.from_transport_options)
    assert {"master_name", "sentinel_kwargs"} <= set(SentinelChannel.from_transport_options)


def test_redis_py_options_leave_the_url_for_the_transport_options_typed() -> None:
    url = (
        "redis://:pw@h:6379/2?socket_timeout=7&socket_keepalive=false&retry_on_timeout=true"
        "&max_connections=9&client_name=w1&health_check_interval=4&timeout=3&protocol=3"
        "&socket_read_size=4096"
    )
    broker = broker_for(url)
    assert broker.url == "redis://:pw@h:6379/2"
    options = broker.transport_options
    assert (options["socket_timeout"], options["socket_keepalive"]) == (7.0, False)
    assert (options["retry_on_timeout"], options["max_connections"]) == (True, 9)
    assert (options["client_name"], options["health_check_interval"]) == ("w1", 4)
    # What shapes only the store's client is not the broker's.
    assert not {"timeout", "protocol", "socket_read_size"} & set(options)
    # db in the query is redis-py's database, so kombu's virtual host.
    assert broker_for("redis://h:6379/0?db=5").url == "redis://h:6379/5"


def test_the_bounds_fill_in_what_the_url_leaves_out() -> None:
    bounds = ConnectionBounds(2.0, 1.0, 3.0)
    options = broker_for(f"redis://h:1/0?{OPTIONS}", bounds=bounds).transport_options
    assert (options["socket_timeout"], options["socket_connect_timeout"]) == (7.0, 3.0)
    assert options["health_check_interval"] == 4
    assert options["socket_keepalive"] is True and options["socket_keepalive_options"]
    plain = broker_for("redis://h:1/0", bounds=bounds).transport_options
    assert (plain["socket_timeout"], plain["socket_connect_timeout"]) == (2.0, 1.0)
    assert plain["health_check_interval"] == 3.0
    # 0 turns redis-py's check off; kombu would spin on it, so its own interval stays.
    assert (
        broker_for("redis://h:1/0?health_check_interval=0", bounds=bounds).transport_options[
            "health_check_interval"
        ]
        == 3.0
    )


def test_unix_sockets_tls_and_sentinel_in_kombus_spelling() -> None:
    unix = broker_for("unix:///run/r.sock?db=3&socket_timeout=2")
    assert unix.url == "redis+socket:///run/r.sock?virtual_host=3"
    assert unix.transport_options["socket_timeout"] == 2.0
    assert "socket_keepalive" not in unix.transport_options  # no TCP on a unix socket
    tls = broker_for("rediss://h:1/0?ssl_ca_certs=/ca.pem&socket_timeout=2")
    assert tls.url == "rediss://h:1/0"
    # Certificates are checked, as redis-py checks them (kombu alone would not).
    assert tls.use_ssl == {"ssl_cert_reqs": "required", "ssl_ca_certs": "/ca.pem"}
    unverified = broker_for("rediss://h:1/0?ssl_cert_reqs=none")
    assert unverified.use_ssl == {"ssl_cert_reqs": "none"}
    sentinel = broker_for(
        "redis+sentinel://u:p%40ss@s1:26379,s2:26380/main/4?socket_timeout=3&sentinel_password=x"
    )
    assert sentinel.url == "sentinel://u:p%40ss@s1:26379/4;sentinel://u:p%40ss@s2:26380/4"
    assert sentinel.transport_options["master_name"] == "main"
    assert sentinel.transport_options["sentinel_kwargs"]["password"] == "x"
    assert sentinel.transport_options["sentinel_kwargs"]["socket_timeout"] == 3.0


def test_a_bad_value_or_an_unknown_option_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="socket_timeout"):
        broker_for("redis://h:1/0?socket_timeout=soon")
    with pytest.raises(ConfigurationError, match="colour") as caught:
        broker_for("redis://:hunter2@h:1/0", "redis://:hunter2@h:1/0?colour=blue")
    assert "hunter2" not in caught.value.message


def test_a_celery_app_connects_with_the_options(redis_server: RedisServer) -> None:
    """kombu's channel runs with the URL's options, on a real Redis."""
    app = sender_app(f"{redis_server.url}?{OPTIONS}&client_name=convoq-broker")
    try:
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            assert channel.socket_timeout == 7.0
            assert channel.health_check_interval == 4
            client = channel.client
            assert client.ping()
            names = [c["name"] for c in client.client_list()]
            assert "convoq-broker" in names
            assert client.connection_pool.connection_kwargs["socket_connect_timeout"] == 3.0
    finally:
        app.close()
    config = celery_base_config(f"{redis_server.url}?{OPTIONS}")
    assert config["broker_connection_timeout"] == 3.0
    assert config["broker_transport_options"]["visibility_timeout"] == 3600


@pytest.fixture
def url_with_options(redis_server: RedisServer) -> str:
    return f"{redis_server.url}?socket_timeout=5&health_check_interval=2"


@pytest.fixture
def pool(url_with_options: str, tmp_path: Path) -> Iterator[WorkerPool]:
    """A worker on a Redis URL with redis-py options, whose sweeper never sweeps (the test
    holds its lock): only kicks start and resume turns."""
    started = WorkerPool(url_with_options, tmp_path / "logs", sweep_interval_s=600)
    with redis.Redis.from_url(url_with_options) as r:
        r.set(KeySchema(started.prefix).sweeper_lock(), "held-by-the-test", px=600_000)
    try:
        started.start(1)
        yield started
    finally:
        started.stop_all()


def test_a_worker_on_a_url_with_options_runs_turns_and_every_kick_arrives(
    pool: WorkerPool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="convoq.client")
    cid, other = f"opts-{uuid.uuid4().hex[:8]}", f"opts-{uuid.uuid4().hex[:8]}"
    with pool.client() as client:
        assert client.submit(cid, "hello", agent="echo").wait(30).text == "seen: hello"
        # An approval's resume: a kick through send_task.
        parked = client.submit(cid, "pay", agent="approver")
        pending = parked.wait(30).pending_approvals
        assert client.approve(parked, pending[0].id) == "resume"
        assert parked.wait(30).text.startswith("after tool: transferred 5")
        # A discarded parked turn wakes the turn behind it: a drain kick.
        stuck = client.submit(other, "pay", agent="approver")
        assert stuck.wait(30).status == "awaiting_approval"
        behind = client.submit(other, "after", agent="echo")
        assert client.cancel(stuck) == "cancelled"
        assert behind.wait(30).text.startswith("seen:")
    assert "could not send" not in caplog.text
    assert "unexpected keyword" not in pool.logs()

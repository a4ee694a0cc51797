"""The consumer's broker channel reuses one redis-py client per connection pool
(:mod:`convoq.worker._broker_client`); kombu's own channel is what it changes."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from kombu import Connection

from convoq.worker._broker_client import ReusedClient, reuse_clients

pytestmark = pytest.mark.fast_paths


def test_one_client_serves_every_call_on_one_pool() -> None:
    made: list[redis.Redis] = []

    def make(**kwargs: object) -> redis.Redis:
        client = redis.Redis(**kwargs)  # type: ignore[arg-type]
        made.append(client)
        return client

    factory = ReusedClient(make)
    pool, other = redis.ConnectionPool(), redis.ConnectionPool()
    first = factory(connection_pool=pool)
    assert factory(connection_pool=pool) is first
    assert factory(connection_pool=other) is not first  # a new pool: a new client
    assert factory(connection_pool=other).connection_pool is other
    assert len(made) == 2


class _Consumer:
    """What ``reuse_clients`` reads of Celery's consumer: ``task_consumer.channel``."""

    def __init__(self, channel: object) -> None:
        self.task_consumer = type("TaskConsumer", (), {"channel": channel})()


def test_the_redis_channel_of_a_consumer_gets_it_once(redis_url: str) -> None:
    with Connection(redis_url) as connection:
        channel: Any = connection.default_channel  # kombu's Redis channel
        consumer = _Consumer(channel)
        assert reuse_clients(consumer)
        assert not reuse_clients(consumer)  # already done
        with channel.conn_or_acquire() as a, channel.conn_or_acquire() as b:
            assert a is b and a.ping()


def test_another_broker_is_left_alone() -> None:
    with Connection("memory://") as connection:
        assert not reuse_clients(_Consumer(connection.default_channel))

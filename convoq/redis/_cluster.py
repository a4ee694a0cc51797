"""Clients for a Redis Cluster (``redis+cluster://``, see :mod:`convoq.redis._urls`).

Every conversation key carries the hash tag ``{cid}`` and every script gets all its keys in
``KEYS``, so each script and each MULTI/EXEC runs on one slot; redis-py's cluster client
routes it to the slot's primary and follows ``MOVED``/``ASK`` redirections. ``SCAN`` on it
visits every primary. The deployment-wide registry keys live on different slots and are
never written in one transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeAlias, TypeVar

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import ClusterPipeline
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import ClusterNode
from redis.cluster import RedisCluster as SyncRedisCluster
from redis.exceptions import (
    ClusterError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.retry import Retry

from convoq._connection_bounds import ConnectionBounds
from convoq.redis._urls import parse_cluster_url

# A client of either kind: one Redis (or a proxy in front of several), or a cluster.
AsyncRedis: TypeAlias = aioredis.Redis | aioredis.RedisCluster
SyncRedis: TypeAlias = redis.Redis | SyncRedisCluster

# What the cluster client raises, once its own retries ran out, while a slot cannot be
# served: its primary is down (before a replica took over), or the slot is unassigned or
# still moving. Like a Redis that cannot be reached, it says nothing about the request.
# ClusterError is redis-py's "TTL exhausted": a slot held half moved answers TRYAGAIN to
# every multi-key script for as long as the move takes, which can outlast the client's
# sixteen redirections (about half a second); ClusterDownError is one of its kind.
CLUSTER_UNAVAILABLE: tuple[type[Exception], ...] = (
    ClusterError,
    SlotNotCoveredError,
    TryAgainError,
)

# Attempts of a command across redirections and node failovers (redis-py's cluster retry).
_RETRIES = 5


T = TypeVar("T")
# Set while a call holds a permit: what redis-py runs inside it (a pipeline resending a
# redirected command on its own) must not wait for a second one.
_HOLDING: ContextVar[bool] = ContextVar("convoq_cluster_permit", default=False)


class _WaitingCluster(aioredis.RedisCluster):
    """redis-py's cluster client, except that at ``max_in_flight`` calls in flight the next
    one waits for a free slot, as the standalone pool does, instead of failing with
    ``MaxConnectionsError`` (redis-py's limit is per node; a call holds at most one
    connection per node, nested resends aside, so its own limit stays a backstop)."""

    def __init__(self, *, max_in_flight: int, **options: Any) -> None:
        super().__init__(max_connections=2 * max_in_flight, **options)
        self.in_flight = asyncio.Semaphore(max_in_flight)

    async def bounded(self, call: Callable[[], Awaitable[T]]) -> T:
        if _HOLDING.get():
            return await call()
        async with self.in_flight:
            token = _HOLDING.set(True)
            try:
                return await call()
            finally:
                _HOLDING.reset(token)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        return await self.bounded(
            lambda: super(_WaitingCluster, self).execute_command(*args, **kwargs)
        )

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        if shard_hint:
            raise RedisClusterException("shard_hint is deprecated in cluster mode")
        return _WaitingPipeline(self, transaction)  # type: ignore[abstract]


class _WaitingPipeline(ClusterPipeline):
    """A pipeline that takes one permit of its client for its whole round trip."""

    def __init__(self, client: _WaitingCluster, transaction: Any) -> None:
        super().__init__(client, transaction)
        self.waiting_client = client

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        run = super().execute
        return await self.waiting_client.bounded(lambda: run(raise_on_error, allow_redirections))


def connect_cluster(
    url: str,
    *,
    max_connections: int,
    bounds: ConnectionBounds,
    socket_timeout: float | None = None,
    socket_connect_timeout: float | None = None,
) -> aioredis.RedisCluster:
    """An asyncio cluster client for ``url``: at ``max_connections`` calls in flight, more
    callers wait for one to finish; its connections bounded by ``bounds`` (the explicit
    timeouts win)."""
    address = parse_cluster_url(url)
    explicit = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_connect_timeout}
    options = {**bounds.redis_options(tcp=True), **address.tls}
    # No default reply timeout: with one, redis-py's asyncio cluster client sends each
    # command under asyncio.wait_for, and concurrent calls that reload a script (after a
    # NOSCRIPT) now and then wrote to a connection another call had just closed
    # (AttributeError: 'NoneType' object has no attribute 'writelines'; 1 run in 2 to 6
    # of the concurrent-append memory test, none in 12 without it). TCP keepalive (probes
    # after one bound idle) and the health checks still notice a dead connection.
    options["socket_timeout"] = None
    options.update({k: v for k, v in explicit.items() if v is not None})
    return _WaitingCluster(
        startup_nodes=[AsyncClusterNode(host, port) for host, port in address.nodes],
        username=address.username,
        password=address.password,
        decode_responses=False,
        max_in_flight=max_connections,
        retry=AsyncRetry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), retries=_RETRIES),
        **options,
    )


def connect_cluster_blocking(
    url: str, *, max_connections: int, bounds: ConnectionBounds
) -> SyncRedisCluster:
    """A sync cluster client for ``url``, configured as :func:`connect_cluster`."""
    address = parse_cluster_url(url)
    options = {"max_connections": max_connections, **bounds.redis_options(tcp=True)}
    return SyncRedisCluster(
        startup_nodes=[
            ClusterNode(host, port)  # type: ignore[no-untyped-call]
            for host, port in address.nodes
        ],
        username=address.username,
        password=address.password,
        decode_responses=False,
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), retries=_RETRIES),
        **options,
        **address.tls,
    )


def connection_option(client: AsyncRedis, name: str) -> Any:
    """An option ``client`` opens its connections with (e.g. ``socket_timeout``)."""
    if isinstance(client, aioredis.RedisCluster):
        return client.get_connection_kwargs().get(name)
    return client.connection_pool.connection_kwargs.get(name)

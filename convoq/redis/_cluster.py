"""Clients for a Redis Cluster (``redis+cluster://``, see :mod:`convoq.redis._urls`).

Every conversation key carries the hash tag ``{cid}`` and every script gets all its keys in
``KEYS``, so each script and each MULTI/EXEC runs on one slot; redis-py's cluster client
routes it to the slot's primary and follows ``MOVED``/``ASK`` redirections. ``SCAN`` on it
visits every primary. The deployment-wide registry keys live on different slots and are
never written in one transaction.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import ClusterNode
from redis.cluster import RedisCluster as SyncRedisCluster
from redis.exceptions import ClusterDownError, SlotNotCoveredError, TryAgainError
from redis.retry import Retry

from convoq.redis._urls import parse_cluster_url

# A client of either kind: one Redis (or a proxy in front of several), or a cluster.
AsyncRedis: TypeAlias = aioredis.Redis | aioredis.RedisCluster
SyncRedis: TypeAlias = redis.Redis | SyncRedisCluster

# What the cluster client raises, once its own retries ran out, while a slot cannot be
# served: its primary is down (before a replica took over), or the slot is unassigned or
# still moving. Like a Redis that cannot be reached, it says nothing about the request.
CLUSTER_UNAVAILABLE: tuple[type[Exception], ...] = (
    ClusterDownError,
    SlotNotCoveredError,
    TryAgainError,
)

# Attempts of a command across redirections and node failovers (redis-py's cluster retry).
_RETRIES = 5


def connect_cluster(
    url: str,
    *,
    max_connections: int,
    socket_timeout: float | None,
    socket_connect_timeout: float | None,
) -> aioredis.RedisCluster:
    """An asyncio cluster client for ``url``; ``max_connections`` is per node, and a call
    beyond it fails (``MaxConnectionsError``) instead of waiting, as redis-py does."""
    address = parse_cluster_url(url)
    return aioredis.RedisCluster(
        startup_nodes=[AsyncClusterNode(host, port) for host, port in address.nodes],
        username=address.username,
        password=address.password,
        decode_responses=False,
        max_connections=max_connections,
        retry=AsyncRetry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), retries=_RETRIES),
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_connect_timeout,
    )


def connect_cluster_blocking(url: str, *, max_connections: int) -> SyncRedisCluster:
    """A sync cluster client for ``url``, configured as :func:`connect_cluster`."""
    address = parse_cluster_url(url)
    options: dict[str, Any] = {"max_connections": max_connections}
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
    )


def connection_option(client: AsyncRedis, name: str) -> Any:
    """An option ``client`` opens its connections with (e.g. ``socket_timeout``)."""
    if isinstance(client, aioredis.RedisCluster):
        return client.get_connection_kwargs().get(name)
    return client.connection_pool.connection_kwargs.get(name)

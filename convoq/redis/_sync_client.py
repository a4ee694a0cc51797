"""The store's blocking I/O, for sync callers that should not hop to the bridge loop.

Only I/O lives here: a sync client configured like :func:`convoq.redis.connect` (same
options, retries and errors) and the same scripts registered on it. What is sent and how
replies are read are the step functions the async path runs too
(:mod:`convoq.redis._history`), driven by :func:`convoq._sync.drive`.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.commands.core import Script
from redis.connection import AbstractConnection
from redis.exceptions import AuthenticationError

from convoq._connection_bounds import ConnectionBounds
from convoq._redis_urls import is_sentinel_url
from convoq.redis import _pipelined
from convoq.redis._base import credentials_refused, new_pool
from convoq.redis._cluster import SyncRedis, connect_cluster_blocking
from convoq.redis._retry import BudgetedSyncRetry
from convoq.redis._sentinel import connect_sentinel_blocking
from convoq.redis._urls import is_cluster_url
from convoq.redis.scripts import NAMES, Request, ScriptCall, source, with_status


def connect_blocking(
    url: str, *, max_connections: int = 64, bounds: ConnectionBounds | None = None
) -> SyncRedis:
    """A sync client for ``url``, configured as :func:`convoq.redis.connect` (a
    ``redis+cluster://`` URL gives redis-py's sync ``RedisCluster``); safe to share between
    threads, and a forked child opens its own connections."""
    bounds = bounds or ConnectionBounds.default()
    if is_cluster_url(url):
        return connect_cluster_blocking(url, max_connections=max_connections, bounds=bounds)
    retry = BudgetedSyncRetry(bounds.retry_budget_s)
    if is_sentinel_url(url):
        return connect_sentinel_blocking(
            url, max_connections=max_connections, retry=retry, handshake=_handshake,
            bounds=bounds,
        )  # fmt: skip
    pool = new_pool(
        redis.BlockingConnectionPool,
        retry,
        _handshake,
        url,
        max_connections=max_connections,
        bounds=bounds,
    )
    return redis.Redis.from_pool(pool)


def _handshake(connection: AbstractConnection) -> None:
    try:
        # Without a health check, as the async handshake (convoq.redis._base) says why.
        unchecked = getattr(connection, "on_connect_check_health", None)
        if unchecked is not None:
            unchecked(check_health=False)
        else:
            connection.on_connect()  # type: ignore[no-untyped-call]
    except AuthenticationError as exc:
        connection.disconnect()  # type: ignore[no-untyped-call]
        raise credentials_refused(connection, exc) from exc


class BlockingScripts:
    """Every script registered on one sync client: the twin of
    :class:`convoq.redis.scripts.Scripts` for requests performed on the caller's thread
    (``fast_paths_on`` as there)."""

    def __init__(self, client: SyncRedis, *, fast_paths_on: bool | None = None) -> None:
        self.client = client
        self._scripts: dict[str, Script] = {
            name: client.register_script(source(name)) for name in NAMES
        }
        # Hot calls skip redis-py's machinery, unless the fast paths are off (a cluster
        # client keeps it: it routes).
        self._direct = _pipelined.enabled_for(client, fast_paths_on)

    def run(self, name: str, keys: list[str], args: list[Any]) -> list[Any]:
        """Run script ``name``; its reply is a list whose first item is a str status."""
        script = self._scripts[name]
        if self._direct and isinstance(self.client, redis.Redis):
            reply = _pipelined.script(self.client, script.sha, keys, args)
            if reply is not _pipelined.FALLBACK:
                return with_status(reply)
        return with_status(script(keys=keys, args=args))

    def perform(self, request: Request) -> Any:
        """The reply to one request of a step function."""
        if isinstance(request, ScriptCall):
            return self.run(request.name, request.keys, request.args)
        client = self.client
        if self._direct and isinstance(client, redis.Redis) and _pipelined.plain(request.commands):
            replies = _pipelined.read(client, request.commands, request.transaction)
            if replies is not None:
                return replies
        with self.client.pipeline(transaction=request.transaction) as pipe:
            for command in request.commands:
                pipe.execute_command(*command)
            return pipe.execute(raise_on_error=False)

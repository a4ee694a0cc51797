"""Clients for a Redis served by Sentinel (``redis+sentinel://``, see :mod:`convoq._redis_urls`).

redis-py's Sentinel pool asks the sentinels for the service's primary whenever one of its
connections opens, so a connection dropped by a failover opens again on the promoted
replica, and a primary demoted to a replica (a ``READONLY`` reply) drops its connection.
Its pool fails when every connection is in use; convoq's waits for a free one, as the
standalone pool does (``BlockingConnectionPool``), so each flavour here is redis-py's
Sentinel pool over its blocking pool (both public classes; the test runs them against a
real Sentinel). Everything else (retries, handshake, bounds) is as for ``redis://``.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
from redis import sentinel as sync_sentinel
from redis.asyncio import sentinel as async_sentinel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from convoq._connection_bounds import ConnectionBounds
from convoq._redis_urls import SentinelAddress, parse_sentinel_url, redacted
from convoq.errors import ConfigurationError

# The options the sentinels' own connections take from the servers' (redis-py's default).
_FOR_SENTINELS = ("socket_timeout", "socket_connect_timeout", "socket_keepalive",
                  "socket_keepalive_options")  # fmt: skip


class _WaitingPool(async_sentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """redis-py's async Sentinel pool that waits for a free connection; closing it (as
    closing its client does) closes the connections to the sentinels too."""

    async def aclose(self) -> None:
        await super().aclose()
        close = getattr(self.sentinel_manager, "aclose", None)  # older redis-py: none
        if close is not None:
            await close()


class _WaitingSyncPool(sync_sentinel.SentinelConnectionPool, redis.BlockingConnectionPool):
    """The sync twin of :class:`_WaitingPool`."""

    def close(self) -> None:
        super().close()
        close = getattr(self.sentinel_manager, "close", None)  # older redis-py: none
        if close is not None:
            close()


def connect_sentinel(
    url: str,
    *,
    max_connections: int,
    retry: Any,
    handshake: Any,
    bounds: ConnectionBounds,
    explicit: dict[str, Any] | None = None,
) -> aioredis.Redis:
    """An asyncio client of the primary a Sentinel URL names: its connections take the
    URL's options over ``bounds``, under ``explicit`` ones (those that are not None)."""
    address = parse_sentinel_url(url)
    options = _options(address, bounds, explicit)
    manager = async_sentinel.Sentinel(  # type: ignore[no-untyped-call]
        address.sentinels, sentinel_kwargs=_sentinel_kwargs(address, options)
    )
    pool = _checked(_WaitingPool, address, manager, url, max_connections, retry, handshake, options)
    return aioredis.Redis.from_pool(pool)


def connect_sentinel_blocking(
    url: str, *, max_connections: int, retry: Any, handshake: Any, bounds: ConnectionBounds
) -> redis.Redis:
    """The sync twin of :func:`connect_sentinel`."""
    address = parse_sentinel_url(url)
    options = _options(address, bounds, None)
    manager = sync_sentinel.Sentinel(  # type: ignore[no-untyped-call]
        address.sentinels, sentinel_kwargs=_sentinel_kwargs(address, options)
    )
    pool = _checked(
        _WaitingSyncPool, address, manager, url, max_connections, retry, handshake, options
    )
    return redis.Redis.from_pool(pool)


def _checked(
    pool_class: Any,
    address: SentinelAddress,
    manager: Any,
    url: str,
    max_connections: int,
    retry: Any,
    handshake: Any,
    options: dict[str, Any],
) -> Any:
    """The pool, its options checked by building one connection (which opens nothing)."""
    try:
        pool = pool_class(
            address.service,
            manager,
            db=address.db,
            username=address.username,
            password=address.password,
            max_connections=max_connections,
            timeout=60,
            decode_responses=False,
            retry=retry,
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
            redis_connect_func=handshake,
            **options,
        )
        pool.connection_class(**pool.connection_kwargs)
    except (TypeError, ValueError) as exc:
        shown = redacted(url)
        raise ConfigurationError(f"the Redis URL {shown} does not work: {exc}", url=shown) from exc
    return pool


def _options(
    address: SentinelAddress, bounds: ConnectionBounds, explicit: dict[str, Any] | None
) -> dict[str, Any]:
    options = {**bounds.redis_options(tcp=True), **address.options}
    options.update({k: v for k, v in (explicit or {}).items() if v is not None})
    return options


def _sentinel_kwargs(address: SentinelAddress, options: dict[str, Any]) -> dict[str, Any]:
    """How the sentinels themselves are reached: the servers' socket options, and the
    sentinels' own credentials when the URL gives them."""
    kwargs = {name: options[name] for name in _FOR_SENTINELS if name in options}
    return {**kwargs, **address.sentinel_auth}

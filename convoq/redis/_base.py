"""What every part of :class:`~convoq.redis.protocol.TurnProtocol` shares: the client, the
scripts, the limits, and the mapping of script statuses to errors."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from convoq import defaults
from convoq._connection_bounds import ConnectionBounds
from convoq._redis_urls import is_sentinel_url, redacted
from convoq.errors import (
    ConfigurationError,
    ConvoqError,
)
from convoq.limits import Limits, QueueLimits, queue_limits
from convoq.redis._cluster import (
    CLUSTER_UNAVAILABLE,
    AsyncRedis,
    connect_cluster,
    connection_option,
)
from convoq.redis._codec import text
from convoq.redis._durable import Acks, replicated
from convoq.redis._refusals import Refusal, refusal_error
from convoq.redis._retry import BudgetedRetry
from convoq.redis._sentinel import connect_sentinel
from convoq.redis._urls import is_cluster_url
from convoq.redis.keys import KeySchema
from convoq.redis.scripts import Scripts
from convoq.settings import ConvoqSettings
from convoq.turn_state import TurnEvent

# Errors that say Redis cannot be reached (after the client's own retries and reconnects),
# as opposed to errors of the request itself: the set connect() retries on, and a cluster
# that cannot serve the slot now (its primary down, the slot unassigned or mid-move).
_UNREACHABLE: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError)
REDIS_UNAVAILABLE: tuple[type[Exception], ...] = (*_UNREACHABLE, *CLUSTER_UNAVAILABLE)


def connect(
    url: str,
    *,
    max_connections: int = 64,
    socket_timeout: float | None = None,
    socket_connect_timeout: float | None = None,
    bounds: ConnectionBounds | None = None,
) -> AsyncRedis:
    """A client for ``url`` that reconnects and resends after a dropped connection (a
    Redis restart; every script is safe to replay) and, at ``max_connections`` calls in
    flight, waits for a free connection instead of failing.

    Args:
        url: ``redis://[[user]:password@]host:port/db``, ``rediss://...`` for TLS (with
            ``?ssl_ca_certs=/path/ca.pem`` to trust a private CA, ``ssl_cert_reqs=none``
            to skip verification, ``ssl_certfile``/``ssl_keyfile`` for a client
            certificate), ``unix:///path/redis.sock?db=0``,
            ``redis+cluster://[[user]:password@]host:port[,host:port...]`` for a Redis
            Cluster (any reachable startup node will do; the client is then redis-py's
            ``RedisCluster``), or
            ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]``
            for a Redis served by Sentinel (see :mod:`convoq._redis_urls`). Every
            redis-py option may follow in the query (``?socket_timeout=5``).
            Percent-encode special characters of the user name and password.
        max_connections: connections in the pool; more callers wait for one (on a
            cluster: calls in flight; more callers wait for one to finish).
        socket_timeout: seconds a reply may take. Given here, it wins over
            ``socket_timeout`` in the URL, which wins over ``bounds``. Callers of blocking
            reads (``XREAD BLOCK``) block for less.
        socket_connect_timeout: seconds a connect may take (wins as ``socket_timeout``).
        bounds: the socket timeout, connect timeout, health checks and keepalive of every
            connection, where the URL does not set them
            (:class:`~convoq._connection_bounds.ConnectionBounds`; None: the defaults'),
            and how long a failed call is sent again.

    Raises:
        ConfigurationError: the URL cannot work (unknown scheme, a bad option, TLS options
            without ``rediss://``). Credentials Redis refuses raise ConfigurationError on
            first use, at once rather than after the reconnect retries.
    """
    bounds = bounds or ConnectionBounds.default()
    explicit = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_connect_timeout}
    if is_cluster_url(url):
        return connect_cluster(url, max_connections=max_connections, bounds=bounds, **explicit)
    retry = BudgetedRetry(bounds.retry_budget_s)
    if is_sentinel_url(url):
        return connect_sentinel(
            url, max_connections=max_connections, retry=retry, handshake=_handshake,
            bounds=bounds, explicit=explicit,
        )  # fmt: skip
    pool = new_pool(
        aioredis.BlockingConnectionPool,
        retry,
        _handshake,
        url,
        max_connections=max_connections,
        bounds=bounds,
        **explicit,
    )
    return aioredis.Redis.from_pool(pool)


def new_pool(
    pool_class: Any,
    retry: Any,
    handshake: Any,
    url: str,
    *,
    max_connections: int,
    bounds: ConnectionBounds,
    socket_timeout: float | None = None,
    socket_connect_timeout: float | None = None,
) -> Any:
    """A redis-py pool (async or sync flavour: its class, retry and handshake) for ``url``,
    configured and checked as :func:`connect` documents."""
    try:
        pool = pool_class.from_url(
            url,
            max_connections=max_connections,
            timeout=60,
            decode_responses=False,
            retry=retry,
            retry_on_error=list(_UNREACHABLE),
            redis_connect_func=handshake,
        )
        options = pool.connection_kwargs
        tcp = "path" not in options  # a unix socket has no TCP options
        for name, value in bounds.redis_options(tcp=tcp).items():
            options.setdefault(name, value)  # the URL's own options win
        explicit = {"socket_timeout": socket_timeout}
        explicit["socket_connect_timeout"] = socket_connect_timeout
        options.update({k: v for k, v in explicit.items() if v is not None})
        pool.connection_class(**options)  # checks the options, opens nothing
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(_url_problem(url, exc), url=redacted(url)) from exc
    _check_tls_files(pool.connection_kwargs, url)
    return pool


async def _handshake(connection: AbstractConnection) -> None:
    """redis-py's own connect handshake (AUTH, SELECT, ...), except that refused
    credentials are a configuration error: retrying them like a dropped connection would
    only delay the same answer."""
    try:
        # Without a health check: a PING before AUTH would fail and reconnect, running
        # this handshake again, without end (redis-py's own handshake skips it too).
        # (Older redis-py releases have no on_connect_check_health.)
        unchecked = getattr(connection, "on_connect_check_health", None)
        await (unchecked(check_health=False) if unchecked else connection.on_connect())
    except AuthenticationError as exc:
        await connection.disconnect()
        raise credentials_refused(connection, exc) from exc


def credentials_refused(connection: Any, exc: AuthenticationError) -> ConfigurationError:
    """The error for credentials Redis refused on ``connection`` (either flavour)."""
    where = getattr(connection, "path", "") or (
        f"{getattr(connection, 'host', '?')}:{getattr(connection, 'port', '?')}"
    )
    user = connection.username or "default"
    refused = (
        f"refused the credentials of user {user!r}"
        if connection.password
        else "wants a password and the URL has none"
    )
    return ConfigurationError(
        f"Redis at {where} {refused} ({exc}); check the user name and password in the"
        " Redis URL (redis://user:password@host:port/db)",
        server=where,
        user=user,
    )


def _check_tls_files(options: dict[str, Any], url: str) -> None:
    """A missing PEM file would surface only at the first connect, retried as if the
    network had failed."""
    for option in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        path = options.get(option)
        if path and not os.path.isfile(path):
            raise ConfigurationError(
                f"{option}={path} in the Redis URL {redacted(url)} is not a file; give the"
                " path of the PEM file",
                url=redacted(url),
            )


def _url_problem(url: str, exc: Exception) -> str:
    shown = redacted(url)
    query = parse_qs(urlsplit(url).query)
    if urlsplit(url).scheme != "rediss" and any(name.startswith("ssl_") for name in query):
        return f"the Redis URL {shown} has TLS options (ssl_*) but TLS needs rediss://"
    return f"the Redis URL {shown} does not work: {exc}"


class ProtocolBase:
    """Client, key schema, scripts and limits of a turn protocol."""

    def __init__(
        self,
        redis: AsyncRedis,
        keys: KeySchema,
        *,
        max_attachment_bytes: int = defaults.MAX_ATTACHMENT_BYTES,
        max_turn_bytes: int = defaults.MAX_TURN_BYTES,
        turn_ttl_s: int = defaults.TURN_TTL_S,
        events_maxlen: int = 1000,
        conversation_ttl_s: int | None = defaults.CONVERSATION_TTL_S,
        queue_limits: QueueLimits | None = None,
        min_replicas_acked: int = defaults.MIN_REPLICAS_ACKED,
        replica_ack_timeout_ms: int = defaults.REPLICA_ACK_TIMEOUT_MS,
        fast_paths: bool | None = None,
    ) -> None:
        if connection_option(redis, "decode_responses"):
            raise ConfigurationError(
                "the turn protocol needs a redis client with decode_responses=False"
                " (attachments are raw bytes)"
            )
        self.redis = redis
        self.keys = keys
        self.limits = Limits(max_attachment_bytes, max_turn_bytes)
        self.queue_limits = queue_limits if queue_limits is not None else QueueLimits()
        # With an idle TTL, no per-turn key may outlive the conversation's history.
        self.conversation_ttl_ms = (
            int(conversation_ttl_s * 1000) if conversation_ttl_s is not None else None
        )
        self.turn_ttl_ms = min(int(turn_ttl_s * 1000), self.conversation_ttl_ms or 1 << 62)
        self.events_maxlen = events_maxlen
        self.scripts = Scripts(redis, fast_paths_on=fast_paths)
        self.acks = Acks(min_replicas_acked, replica_ack_timeout_ms)
        self._owns_client = False

    @classmethod
    def from_settings(cls, redis: AsyncRedis, settings: ConvoqSettings) -> Self:
        """The protocol an entry point (client, worker, gateway, memory) runs with: every
        setting it has taken from ``settings``, which that entry point resolved once
        (:meth:`ConvoqSettings.resolve`), so they all agree."""
        return cls(
            redis,
            KeySchema(settings.prefix),
            max_attachment_bytes=settings.max_attachment_bytes,
            max_turn_bytes=settings.max_turn_bytes,
            turn_ttl_s=settings.turn_ttl_s,
            conversation_ttl_s=settings.conversation_ttl_s,
            queue_limits=queue_limits(settings),
            min_replicas_acked=settings.min_replicas_acked,
            replica_ack_timeout_ms=settings.replica_ack_timeout_ms,
            fast_paths=settings.fast_paths,
        )

    @classmethod
    def from_url(cls, url: str, *, prefix: str = defaults.PREFIX, **limits: Any) -> Self:
        """A protocol on its own client for ``url`` (closed by :meth:`close`)."""
        keys = KeySchema(prefix)  # checked before a client exists
        protocol = cls(connect(url), keys, **limits)
        protocol._owns_client = True
        return protocol

    async def close(self) -> None:
        """Close the client if this protocol opened it."""
        if self._owns_client:
            await self.redis.aclose()

    async def run_acked(self, name: str, cid: str, keys: list[str], args: list[Any]) -> list[Any]:
        """Run write script ``name`` of conversation ``cid``; with ``min_replicas_acked``,
        its reply comes once that many replicas have it (else NotDurableError)."""
        return await self.scripts.run_acked(name, keys, args, self.acks, self.keys.acked(cid))

    async def replicated_status(self, cid: str, tid: str) -> str | None:
        """Turn ``tid``'s status (None: no record), read on the primary and answered once
        ``min_replicas_acked`` replicas have everything up to that read.

        Raises:
            NotDurableError: fewer replicas confirmed it in time.
        """
        read = ("HGET", self.keys.turn(cid, tid), "status")
        status = await replicated(self.redis, self.acks, self.keys.acked(cid), read)
        return None if status is None else text(status)

    def refusal(
        self, refusal: Refusal, cid: str, tid: str | None, fence: int | None = None
    ) -> ConvoqError:
        """The error for a script status that is not a success (the one table,
        :data:`~convoq.redis._refusals.REFUSALS`)."""
        return refusal_error(refusal, self.keys, cid, tid, fence)

    def event_args(self, events: Sequence[TurnEvent]) -> list[str]:
        """``n, type, data, type, data, ...``: the events a fenced write appends first."""
        args = [str(len(events))]
        for event in events:
            args += [event.type, self.json_arg(event.data, "event data")]
        return args

    def json_arg(self, value: Any, what: str) -> str:
        """``value`` as compact JSON, or a clear error if it is not JSON-safe."""
        try:
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise ConvoqError(
                f"{what} must be JSON-safe (str, numbers, lists, dicts): {exc}"
            ) from exc


def approval_expired_error() -> dict[str, Any]:
    return {
        "type": "ApprovalExpiredError",
        "message": "the tool calls waiting for approval were not decided in time; the turn"
        " is stored with tool results saying so: submit the request again",
        "details": {},
    }

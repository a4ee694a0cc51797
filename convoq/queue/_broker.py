"""The Celery broker as the Redis URL says it: kombu's URL, transport options and TLS.

redis-py and kombu read Redis URLs differently. redis-py takes every connection option
in the query (``?socket_timeout=5&health_check_interval=10``); kombu's ``Connection``
takes none but TLS (an unknown one is a ``TypeError`` at the worker's start) and wants the
rest as *transport options*, under the same names. So a broker that is a Redis is given
to Celery as:

- the URL without its query (a unix socket in kombu's spelling, ``redis+socket://``; a
  Sentinel URL as kombu's ``sentinel://host:port/db;sentinel://...``);
- ``broker_transport_options``: the URL's options kombu's Redis transport takes
  (:data:`KOMBU_OPTIONS`), over convoq's bounds
  (:class:`~convoq._connection_bounds.ConnectionBounds`); with Sentinel, ``master_name``
  and ``sentinel_kwargs`` too;
- ``broker_use_ssl``: the URL's ``ssl_*`` options for ``rediss://``, certificates
  required unless the URL says ``ssl_cert_reqs=none`` (as redis-py does; kombu alone
  would not verify a ``rediss://`` broker given no TLS option).

What only shapes the store's own client (``timeout``, the wait for a pooled connection;
``protocol``; ``socket_read_size``; ``retry_on_error``...) is not the broker's. An AMQP
(or any other) broker URL is taken as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, quote, urlsplit, urlunsplit

import redis

from convoq import defaults
from convoq._connection_bounds import ConnectionBounds
from convoq._redis_urls import is_sentinel_url, parse_sentinel_url, query_options, redacted
from convoq.errors import ConfigurationError

KOMBU_OPTIONS = (
    "socket_timeout",
    "socket_connect_timeout",
    "socket_keepalive",
    "socket_keepalive_options",
    "health_check_interval",
    "retry_on_timeout",
    "max_connections",
    "client_name",
)
"""redis-py's URL options that kombu's Redis transport takes as transport options (the
same names; a test checks each against kombu's ``Channel.from_transport_options``)."""
_REDIS_SCHEMES = ("redis", "rediss", "unix")


@dataclass(frozen=True)
class Broker:
    """What Celery is given for the broker: ``url``, ``transport_options`` and
    ``use_ssl`` (``broker_use_ssl``; None: no TLS, or the URL's scheme says it)."""

    url: str
    transport_options: dict[str, Any] = field(default_factory=dict)
    use_ssl: dict[str, Any] | None = None


def broker_for(
    redis_url: str, broker_url: str | None = None, bounds: ConnectionBounds | None = None
) -> Broker:
    """The broker: ``broker_url`` if given, else the memory Redis, as Celery takes it
    (see the module docstring); ``bounds``: where the URL sets no socket option (None:
    the defaults').

    Raises:
        ConfigurationError: the memory Redis is a cluster and no broker is given (Celery
            cannot use a Redis Cluster as its broker), or the URL has an option redis-py
            does not know or a value it cannot read.
    """
    if not broker_url and urlsplit(redis_url).scheme.lower() in defaults.CLUSTER_SCHEMES:
        raise ConfigurationError(
            "the Redis URL is a Redis Cluster, which Celery cannot use as its broker: set"
            " CONVOQ_BROKER_URL (broker_url=) to a standalone Redis (redis://host:port/0)"
            " or an AMQP broker (amqp://user:password@host:5672//)"
        )
    url = broker_url or redis_url
    bounds = bounds or ConnectionBounds.default()
    if is_sentinel_url(url):
        return _sentinel(url, bounds)
    parts = urlsplit(url)
    if parts.scheme.lower() not in _REDIS_SCHEMES:
        return Broker(url)
    options = query_options(url)
    _check(lambda: redis.BlockingConnectionPool.from_url(url), url)
    tcp = parts.scheme.lower() != "unix"
    transport = {**bounds.redis_options(tcp=tcp), **_kombu_options(options)}
    tls = {k: v for k, v in options.items() if k.startswith("ssl_")}
    use_ssl = {"ssl_cert_reqs": "required", **tls} if parts.scheme.lower() == "rediss" else None
    return Broker(_bare(parts, options), transport, use_ssl)


def broker_url_for(redis_url: str, broker_url: str | None = None) -> str:
    """The broker's URL as kombu takes it (:func:`broker_for`, its ``url``)."""
    return broker_for(redis_url, broker_url).url


def _check(pool: Callable[[], Any], url: str) -> None:
    """Refuse what redis-py would refuse (an unknown option): the store's client checks
    its URL the same way, but a broker URL of its own is read only here."""
    try:
        made = pool()
        made.connection_class(**made.connection_kwargs)  # opens nothing
    except (TypeError, ValueError) as exc:
        shown = redacted(url)
        raise ConfigurationError(
            f"the broker URL {shown} does not work: {exc}", url=shown
        ) from None


def _kombu_options(options: dict[str, Any]) -> dict[str, Any]:
    # kombu schedules its checks every health_check_interval: 0 (off for redis-py) would
    # spin its event loop, so kombu keeps its own interval then.
    return {
        k: v
        for k, v in options.items()
        if k in KOMBU_OPTIONS and not (k == "health_check_interval" and not v)
    }


def _bare(parts: SplitResult, options: dict[str, Any]) -> str:
    """The URL without its query; its database in the path (kombu's virtual host)."""
    if parts.scheme.lower() == "unix":
        # kombu spells a Redis unix socket redis+socket://, with the database in the query.
        return f"redis+socket://{parts.path}?virtual_host={options.get('db', 0)}"
    path = f"/{options['db']}" if "db" in options else parts.path
    return urlunsplit(parts._replace(path=path, query=""))


def _sentinel(url: str, bounds: ConnectionBounds) -> Broker:
    """kombu's Sentinel form: one ``sentinel://`` URL per sentinel (each with the servers'
    credentials and the database), the service as ``master_name``."""
    address = parse_sentinel_url(url)
    _check(lambda: redis.BlockingConnectionPool(**address.options), url)  # type: ignore[no-untyped-call]
    auth = ""
    if address.username or address.password:
        user = quote(address.username or "", safe="")
        auth = f"{user}:{quote(address.password or '', safe='')}@"
    hosts = [
        f"sentinel://{auth}{f'[{host}]' if ':' in host else host}:{port}/{address.db}"
        for host, port in address.sentinels
    ]
    transport = {**bounds.redis_options(tcp=True), **_kombu_options(address.options)}
    sockets = {k: v for k, v in transport.items() if k.startswith("socket_")}
    transport["master_name"] = address.service
    transport["sentinel_kwargs"] = {**sockets, **address.sentinel_auth}
    return Broker(";".join(hosts), transport)

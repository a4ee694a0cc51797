"""Redis URLs as convoq reads them, for the store (redis-py) and the broker (kombu) alike:
the options a URL's query sets, named and typed as redis-py reads them, and the Sentinel
form, which neither redis-py nor kombu reads as one URL.

A Redis served by Sentinel is named by its sentinels and its service (the ``master_name``
sentinels know it by); the client asks a sentinel for the primary and asks again after a
failover::

    redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db][?options]

The credentials are the Redis servers'; sentinels that want their own take
``sentinel_username`` and ``sentinel_password`` in the query. Every other option is a
redis-py option for the servers (``socket_timeout``, ``health_check_interval``...), as in
``redis://``. TLS (``ssl_*``) is not taken with Sentinel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit, urlunsplit

from redis.connection import parse_url

from convoq.defaults import SENTINEL_SCHEMES
from convoq.errors import ConfigurationError

SENTINEL_AUTH = ("sentinel_username", "sentinel_password")
"""Query options of a Sentinel URL for the sentinels themselves (not the Redis servers)."""


def redacted(url: str) -> str:
    """``url`` with its password (and a ``sentinel_password``) replaced by ``***`` (safe
    to log or show)."""
    parts = urlsplit(url)
    if parts.password is not None:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        parts = parts._replace(netloc=netloc)
    if "sentinel_password=" in parts.query:
        query = "&".join(
            "sentinel_password=***" if item.startswith("sentinel_password=") else item
            for item in parts.query.split("&")
        )
        parts = parts._replace(query=query)
    return urlunsplit(parts)


def query_options(url: str) -> dict[str, Any]:
    """The options ``url``'s query sets, named and typed as redis-py reads them
    (``socket_timeout`` a float, ``socket_keepalive`` a bool, ``db`` an int; a name
    redis-py does not know stays a string, for its connection class to refuse).

    Raises:
        ConfigurationError: a value redis-py cannot read (``db=first``).
    """
    return _typed(urlsplit(url).query, redacted(url))


def _typed(query: str, shown: str) -> dict[str, Any]:
    if not query:
        return {}
    try:
        options: dict[str, Any] = parse_url(f"redis://convoq/?{query}")  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise ConfigurationError(f"the Redis URL {shown} does not work: {exc}", url=shown) from None
    options.pop("host", None)
    return options


def is_sentinel_url(url: str | None) -> bool:
    """Whether ``url`` names a Redis served by Sentinel (``redis+sentinel://``)."""
    return bool(url) and urlsplit(url or "").scheme.lower() in SENTINEL_SCHEMES


@dataclass(frozen=True)
class SentinelAddress:
    """What a Sentinel URL says: the sentinels, the service, the database, the servers'
    credentials and options, and the sentinels' own credentials (empty: none)."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None
    options: dict[str, Any] = field(default_factory=dict)
    sentinel_auth: dict[str, str] = field(default_factory=dict)


def parse_sentinel_url(url: str) -> SentinelAddress:
    """The sentinels, service, database, credentials and options of a Sentinel URL.

    Raises:
        ConfigurationError: not a Sentinel URL, no or a bad ``host:port``, no service, a
            database that is not a number, ``db`` in the query, or TLS options.
    """
    parts, shown = urlsplit(url), redacted(url)
    if parts.scheme.lower() not in SENTINEL_SCHEMES:
        raise ConfigurationError(f"{shown} is not a redis+sentinel:// URL", url=shown)
    form = "redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db]"
    service, _, db = parts.path.strip("/").partition("/")
    if not service or (db and not db.isdigit()):
        raise ConfigurationError(
            f"the Sentinel URL {shown} needs the service name and may add a database"
            f" number: {form}",
            url=shown,
        )
    auth, _, hosts = parts.netloc.rpartition("@")
    user, _, password = auth.partition(":")
    sentinels = tuple(host_port(item, shown, form) for item in hosts.split(","))
    given = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    if "db" in given or any(name.startswith("ssl_") for name in given):
        raise ConfigurationError(
            f"the Sentinel URL {shown} has db or ssl_* options: give the database in the"
            f" path ({form}); TLS is not taken with Sentinel",
            url=shown,
        )
    sentinel_auth = {
        name.removeprefix("sentinel_"): given.pop(name) for name in SENTINEL_AUTH if name in given
    }
    return SentinelAddress(
        sentinels,
        unquote(service),
        int(db or 0),
        unquote(user) or None,
        unquote(password) or None,
        _typed(urlencode(given), shown),
        sentinel_auth,
    )


def host_port(item: str, shown: str, form: str) -> tuple[str, int]:
    """One ``host:port`` of a URL naming several servers (``[::1]:7000`` for IPv6).

    Raises:
        ConfigurationError: ``item`` is not ``host:port``; ``form`` says what is.
    """
    host, sep, port = item.strip().rpartition(":")
    host = host.strip("[]")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ConfigurationError(
            f"the URL {shown} names {item!r}, not host:port; write {form}", url=shown
        )
    return host, int(port)

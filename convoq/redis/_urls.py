"""Redis URLs: the cluster form convoq adds to redis-py's, and redaction for messages.

A cluster is named by its startup nodes (any reachable one is enough; the client learns
the rest and the slot map from it)::

    redis+cluster://[[user]:password@]host:port[,host:port...]

Only database 0 exists on a cluster, so the URL has no path (``/`` or ``/0`` are
accepted) and takes no query options.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

from convoq.defaults import CLUSTER_SCHEME
from convoq.errors import ConfigurationError


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***`` (safe to log or show)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def is_cluster_url(url: str | None) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``)."""
    return bool(url) and urlsplit(url or "").scheme.lower() == CLUSTER_SCHEME


@dataclass(frozen=True)
class ClusterAddress:
    """What a cluster URL says: its startup nodes and credentials."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None


def parse_cluster_url(url: str) -> ClusterAddress:
    """The startup nodes and credentials of a ``redis+cluster://`` URL.

    Raises:
        ConfigurationError: not a cluster URL, no or a bad ``host:port``, a database other
            than 0, or query options.
    """
    parts = urlsplit(url)
    shown = redacted(url)
    if parts.scheme.lower() != CLUSTER_SCHEME:
        raise ConfigurationError(f"{shown} is not a {CLUSTER_SCHEME}:// URL", url=shown)
    if parts.path not in ("", "/", "/0") or parts.query:
        raise ConfigurationError(
            f"the cluster URL {shown} has a path or options: a cluster has only database 0"
            " and takes no options (redis+cluster://host:port[,host:port...])",
            url=shown,
        )
    auth, _, hosts = parts.netloc.rpartition("@")
    user, _, password = auth.partition(":")
    nodes = tuple(_node(item, shown) for item in hosts.split(","))
    return ClusterAddress(nodes, unquote(user) or None, unquote(password) or None)


def _node(item: str, shown: str) -> tuple[str, int]:
    host, sep, port = item.strip().rpartition(":")
    host = host.strip("[]")  # an IPv6 address is written [::1]:7000
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ConfigurationError(
            f"the cluster URL {shown} names {item!r}, not host:port; write"
            " redis+cluster://host:port[,host:port...]",
            url=shown,
        )
    return host, int(port)

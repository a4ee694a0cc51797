"""Redis URLs: the cluster form convoq adds to redis-py's, and redaction for messages.

A cluster is named by its startup nodes (any reachable one is enough; the client learns
the rest and the slot map from it)::

    redis+cluster://[[user]:password@]host:port[,host:port...]
    rediss+cluster://[[user]:password@]host:port[,...][?ssl_ca_certs=/path/ca.pem]

Only database 0 exists on a cluster, so the URL has no path (``/`` or ``/0`` are
accepted). The TLS form takes the TLS options of ``rediss://`` (``ssl_ca_certs``,
``ssl_cert_reqs``, ``ssl_certfile``, ``ssl_keyfile``) and no others.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from convoq._redis_urls import host_port, redacted
from convoq.defaults import CLUSTER_SCHEMES
from convoq.errors import ConfigurationError


def is_cluster_url(url: str | None) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``)."""
    return bool(url) and urlsplit(url or "").scheme.lower() in CLUSTER_SCHEMES


@dataclass(frozen=True)
class ClusterAddress:
    """What a cluster URL says: its startup nodes, credentials and TLS options (empty
    without TLS)."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    tls: dict[str, Any] = field(default_factory=dict)


def parse_cluster_url(url: str) -> ClusterAddress:
    """The startup nodes, credentials and TLS options of a cluster URL.

    Raises:
        ConfigurationError: not a cluster URL, no or a bad ``host:port``, a database other
            than 0, an option it does not take, or a TLS file that does not exist.
    """
    parts = urlsplit(url)
    shown = redacted(url)
    scheme = parts.scheme.lower()
    if scheme not in CLUSTER_SCHEMES:
        raise ConfigurationError(f"{shown} is not a redis+cluster:// URL", url=shown)
    if parts.path not in ("", "/", "/0"):
        raise ConfigurationError(
            f"the cluster URL {shown} names a database: a cluster has only database 0"
            " (redis+cluster://host:port[,host:port...])",
            url=shown,
        )
    auth, _, hosts = parts.netloc.rpartition("@")
    user, _, password = auth.partition(":")
    form = "redis+cluster://host:port[,host:port...]"
    nodes = tuple(host_port(item, shown, form) for item in hosts.split(","))
    tls = _tls_options(parts.query, shown) if scheme == "rediss+cluster" else {}
    if scheme == "redis+cluster" and parts.query:
        raise ConfigurationError(
            f"the cluster URL {shown} takes no options; TLS options need rediss+cluster://",
            url=shown,
        )
    return ClusterAddress(nodes, unquote(user) or None, unquote(password) or None, tls)


_TLS_OPTIONS = ("ssl_ca_certs", "ssl_cert_reqs", "ssl_certfile", "ssl_keyfile")


def _tls_options(query: str, shown: str) -> dict[str, Any]:
    given = {name: values[-1] for name, values in parse_qs(query).items()}
    unknown = sorted(set(given) - set(_TLS_OPTIONS))
    if unknown:
        raise ConfigurationError(
            f"the cluster URL {shown} has options {unknown}; it takes only {list(_TLS_OPTIONS)}",
            url=shown,
        )
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if name in given and not os.path.isfile(given[name]):
            raise ConfigurationError(
                f"{name}={given[name]} in the Redis URL {shown} is not a file; give the path"
                " of the PEM file",
                url=shown,
            )
    return {"ssl": True, **given}

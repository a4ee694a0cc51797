"""How long a call may wait on a Redis or Redis-broker connection, unless its URL says.

A connection can die without closing: a NAT or a firewall forgets it, a host goes away, a
failover moves the address. A call on it would wait for ever, holding its pooled
connection. So every connection convoq opens to Redis (the store's clients, and the
broker's through kombu's transport options) is bounded. By default each bound is a
quarter of a lease period (``CONVOQ_LEASE_MS``; at least a second): a lease renewal that
meets a dead connection notices it and goes through on a new one before the next renewal
is due (a third of the lease), and a Redis that stopped answering is reported within about
one lease period:

- a reply may take ``socket_timeout_s`` (``CONVOQ_REDIS_SOCKET_TIMEOUT_S``; never less than
  the replicas' ``WAIT``, ``CONVOQ_REPLICA_ACK_TIMEOUT_MS``, plus a second); then the
  connection is dropped and the call sent again on a new one (every script is
  replay-safe) as long as twice that has not passed since its first send; then it raises;
- a connect may take ``connect_timeout_s`` (``CONVOQ_REDIS_CONNECT_TIMEOUT_S``);
- a connection idle ``health_check_interval_s`` (``CONVOQ_REDIS_HEALTH_CHECK_INTERVAL_S``)
  is checked (``PING``) before its next command; kombu also drops a consumer's ``BRPOP``
  or pub/sub connection whose reply is that overdue;
- TCP keepalive (``CONVOQ_REDIS_SOCKET_KEEPALIVE``) probes a connection idle for one
  socket timeout, then every half of it, and drops it after two unanswered probes.

An option in the URL (``?socket_timeout=30``) wins over its bound; ``0`` in a setting
turns that bound off.
"""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass
from typing import Any

from convoq.settings import ConvoqSettings

# Unanswered keepalive probes before the kernel drops a connection.
_PROBES = 2


@dataclass(frozen=True)
class ConnectionBounds:
    """The bounds of one entry point's Redis and broker connections (None: unbounded)."""

    socket_timeout_s: float | None
    connect_timeout_s: float | None
    health_check_interval_s: float | None
    keepalive: bool = True

    @classmethod
    def of(cls, settings: ConvoqSettings) -> ConnectionBounds:
        """The bounds ``settings`` ask for (see the module docstring for the defaults)."""
        quarter_s = max(1.0, settings.lease_ms / 4000)
        # A WAIT for the replicas is a reply that may take its whole timeout.
        reply_s = max(quarter_s, settings.replica_ack_timeout_ms / 1000 + 1)
        return cls(
            _given(settings.redis_socket_timeout_s, reply_s),
            _given(settings.redis_connect_timeout_s, quarter_s),
            _given(settings.redis_health_check_interval_s, quarter_s),
            settings.redis_socket_keepalive,
        )

    @classmethod
    def default(cls) -> ConnectionBounds:
        """The bounds of the embedded defaults (no ``CONVOQ_*`` read)."""
        return cls.of(ConvoqSettings.model_construct())

    @property
    def retry_budget_s(self) -> float | None:
        """How long after its first send a call may still be sent again on a new
        connection (None: as often as redis-py's retry allows, however long)."""
        return 2 * self.socket_timeout_s if self.socket_timeout_s else None

    def redis_options(self, *, tcp: bool) -> dict[str, Any]:
        """The bounds as redis-py connection options (and kombu transport options, which
        are named the same); ``tcp``: keepalive and the connect timeout apply."""
        options: dict[str, Any] = {}
        if self.socket_timeout_s:
            options["socket_timeout"] = self.socket_timeout_s
        if self.health_check_interval_s:
            options["health_check_interval"] = self.health_check_interval_s
        if tcp:
            if self.connect_timeout_s:
                options["socket_connect_timeout"] = self.connect_timeout_s
            options["socket_keepalive"] = self.keepalive
            if self.keepalive:
                options["socket_keepalive_options"] = self.keepalive_options()
        return options

    def keepalive_options(self) -> dict[int, int]:
        """TCP keepalive timing: first probe after one socket timeout idle (or a minute
        without one), then every half of it; the platform's names, where it has them."""
        idle = math.ceil(self.socket_timeout_s or 60)
        wanted = {"TCP_KEEPIDLE": idle, "TCP_KEEPINTVL": max(1, idle // 2), "TCP_KEEPCNT": _PROBES}
        return {
            getattr(socket, name): value for name, value in wanted.items() if hasattr(socket, name)
        }


def _given(value: float | None, default: float) -> float | None:
    """A setting's bound: unset takes ``default``, 0 means none."""
    if value is None:
        return default
    return value or None

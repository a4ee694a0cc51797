"""One redis-py client for the broker channel of a worker's consumer, instead of one per
call: kombu's Redis channel builds a new ``redis.Redis`` each time it notes a delivered
kick as unacknowledged and each time it acknowledges one (two per kick), and building one
(its response callbacks copied into a fresh case-insensitive dict) costs about as much as
the rest of those calls in Python. Clients of one connection pool share nothing else, so
one serves every call on that pool.

A fenced shortcut: it replaces the channel's ``Client`` factory (kombu internals,
checked with the releases in :data:`CHECKED_WITH`), with ``CONVOQ_FAST_PATHS`` on only.
A channel made anew after a broker reconnect keeps kombu's own factory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kombu.transport import redis as kombu_redis

CHECKED_WITH = ("kombu", ">=5.4,<5.8")
"""The kombu releases whose Redis channel this module changes."""


class ReusedClient:
    """A client factory that returns the client it made last while it is asked for one
    with the same arguments (the same connection pool, compared by identity)."""

    def __init__(self, make: Callable[..., Any]) -> None:
        self._make = make
        self._made: tuple[dict[str, Any], Any] | None = None

    def __call__(self, **kwargs: Any) -> Any:
        made = self._made
        if made is not None and _same(made[0], kwargs):
            return made[1]
        client = self._make(**kwargs)
        self._made = (kwargs, client)
        return client


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(a[key] is b[key] for key in a)


def reuse_clients(consumer: Any) -> bool:
    """Give the Redis channel of ``consumer`` (Celery's) a :class:`ReusedClient`; False
    when its channel is not kombu's Redis channel (another broker) or already has one."""
    channel = getattr(getattr(consumer, "task_consumer", None), "channel", None)
    if not isinstance(channel, kombu_redis.Channel) or isinstance(channel.Client, ReusedClient):
        return False
    # Any: kombu declares a class there; a factory returning clients is all it calls.
    target: Any = channel
    target.Client = ReusedClient(channel.Client)
    return True

"""What a client can tell of the workers behind its Redis, and how it says so: the
workers and the agent names they registered, whether Redis and the broker answer, and the
:class:`Deployment` they make.

A client and its workers meet only through one Redis and one prefix. A client that reaches
another one (an unset ``CONVOQ_REDIS_URL`` in another directory starts another embedded
Redis there; a different prefix) queues turns that no worker will ever take, and it can
check agent names against nothing. So the client names the Redis and says so: once per
client at the first submit (a logged warning), in the message of a wait that ran out on a
turn still queued, and in ``convoq status``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery import Celery
from redis.exceptions import RedisError

from convoq.client._unreachable import unavailable
from convoq.errors import ConfigurationError, UnknownAgentError
from convoq.queue.transport import broker_reachable
from convoq.redis._base import REDIS_UNAVAILABLE

if TYPE_CHECKING:
    from convoq.client.aclient import AsyncClient

log = logging.getLogger("convoq.client")


@dataclass(frozen=True)
class Deployment:
    """The workers one client's Redis and prefix have, as the registry tells it."""

    redis: str
    """Which Redis (its URL without the password, or the embedded server's directory)."""
    prefix: str
    workers: dict[str, dict[str, Any]]
    """As :meth:`AsyncClient.workers` lists them (alive or dead)."""
    ever_registered: bool
    """Whether any worker ever registered under this prefix on this Redis."""
    other_prefixes: list[str]
    """Prefixes workers registered under on this Redis, other than this one."""

    @property
    def alive(self) -> list[str]:
        return sorted(name for name, info in self.workers.items() if info.get("alive"))

    def problem(self) -> str | None:
        """Why turns of this client would wait for ever, or None when a worker is alive."""
        if self.alive:
            return None
        if self.other_prefixes and not self.ever_registered:
            return (
                f"no convoq worker is registered under prefix {self.prefix!r} on"
                f" {self.redis}; workers have registered under {self.other_prefixes}: check"
                f" CONVOQ_PREFIX (turns wait until a worker of prefix {self.prefix!r} starts)"
            )
        if not self.ever_registered:
            return (
                f"no convoq worker has ever registered on {self.redis} (prefix"
                f" {self.prefix!r}): turns queue until one starts there, and agent names"
                " cannot be checked; start a worker with the same CONVOQ_REDIS_URL and"
                " CONVOQ_PREFIX (for the embedded Redis: in the same directory, or with the"
                " same CONVOQ_HOME)"
            )
        return (
            f"no convoq worker is alive on {self.redis} under prefix {self.prefix!r} (each"
            " registered one missed its heartbeats): turns queue until one runs again"
        )


async def deployment(client: AsyncClient) -> Deployment:
    """The deployment ``client`` reaches (three reads of the registry)."""
    workers = await client.workers()
    prefixes = await client.protocol.registered_prefixes()
    return Deployment(
        redis=client.redis_named(),
        prefix=client.prefix,
        workers=workers,
        ever_registered=client.prefix in prefixes or bool(workers),
        other_prefixes=sorted(prefixes - {client.prefix}),
    )


async def check_deployment(client: AsyncClient) -> None:
    """At a client's first submit: refuse to queue where no live worker would take the
    kick because the client's partition count differs from every live worker's; warn
    (once, logged) when no worker is alive to take it."""
    found = await deployment(client)
    live = [found.workers[name] for name in found.alive]
    counts = {w["partitions"] for w in live if isinstance(w.get("partitions"), int)}
    if counts and client.partitions not in counts:
        raise ConfigurationError(
            f"this client routes kicks over {client.partitions} partitions but the live"
            f" workers use {sorted(counts)}: set CONVOQ_PARTITIONS (or partitions=) to"
            " the workers' value",
            partitions=client.partitions,
            workers_partitions=sorted(counts),
        )
    problem = found.problem()
    if problem is not None:
        log.warning("%s", problem)


async def stall_note(client: AsyncClient) -> str:
    """Why a turn of ``client`` may wait for ever ("" when a worker is alive): for the
    message of a wait that ran out."""
    return (await deployment(client)).problem() or ""


class Registry:
    """What one client learns of the workers from their registry in Redis: the agent
    names they run (kept, read again when a submit names another) and, once, whether
    they take this client's kicks at all (:func:`check_deployment`)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self._agents: frozenset[str] = frozenset()
        self._checked = False

    async def agents(self) -> frozenset[str]:
        """Profile names the running workers registered (read now, and kept)."""
        self._agents = await self._client.protocol.registered_agents()
        return self._agents

    async def workers(self) -> dict[str, dict[str, Any]]:
        """The workers as they registered (see ``AsyncClient.workers``)."""
        heartbeat_s = self._client.settings.sweep_interval_s
        return await self._client.protocol.registered_workers(heartbeat_s=heartbeat_s)

    async def check_agent(self, agent: str) -> None:
        """Refuse a profile name no registered worker runs (any name while none has
        registered).

        Raises:
            UnknownAgentError: the workers registered and none runs ``agent``.
        """
        if agent in self._agents:
            return
        known = await self.agents()
        if known and agent not in known:
            raise UnknownAgentError(
                f"no agent profile named {agent!r}; the workers run {sorted(known)}",
                agent=agent,
                known=sorted(known),
            )

    async def check_once(self) -> None:
        """:func:`check_deployment`, at the first submit of the client only."""
        if not self._checked:
            await check_deployment(self._client)
            self._checked = True


async def ping(client: AsyncClient, broker: Callable[[], Celery], timeout_s: float) -> None:
    """Check that ``client``'s Redis and then its broker answer within ``timeout_s`` each
    (see ``AsyncClient.ping``)."""
    try:
        await asyncio.wait_for(client.protocol.redis.ping(), timeout_s)
    except REDIS_UNAVAILABLE as exc:
        raise unavailable(client.redis_named(), exc) from None
    except (TimeoutError, OSError) as exc:  # the wait ran out, or the socket failed
        raise unavailable(client.redis_named(), exc) from None
    except RedisError as exc:
        raise ConfigurationError(f"Redis does not answer: {exc!r}"[:300]) from None
    await broker_reachable(broker(), timeout_s)

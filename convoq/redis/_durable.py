"""Acknowledged means durable: writes that replicas confirm before anyone hears of them.

Redis replicates asynchronously, so a primary that dies right after answering can take the
write with it when a replica is promoted. With ``min_replicas_acked`` n > 0, a write script
(submit, commit, park) runs in one pipeline on one connection to the primary that owns
the conversation's slot, followed by a *probe* (a short-lived ``SET`` of
:meth:`~convoq.redis.keys.KeySchema.acked`) and ``WAIT n timeout``.

Why the probe: ``WAIT`` waits for the last write *of its connection*, and a replayed script
that answers "already applied" writes nothing. Replication is one ordered stream per
primary, so once n replicas have the probe they have everything that primary held when
the script ran: the script's own write, or the earlier one its replay found. Why one
pipeline on one connection: if the connection breaks, the whole pipeline is sent again
(the script is replay-safe), so the ``WAIT`` never counts on a primary other than the one
that ran the script. Fewer than n replicas in time: :class:`~convoq.errors.NotDurableError`,
for the caller to retry (the write stays applied on the primary; its replay is a no-op).

A read that acknowledges (a client seeing a turn final) is confirmed the same way by
:func:`confirm_read`: the read, the probe and ``WAIT`` in one pipeline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from convoq import defaults
from convoq.errors import ConfigurationError, NotDurableError
from convoq.redis._cluster import AsyncRedis

log = logging.getLogger("convoq.redis")
T = TypeVar("T")

# Sends of a write that replicas did not confirm in time before the caller gives up: each
# resend is a replay that only waits for the replicas again.
DURABLE_TRIES = 3
# Pipeline replies (a cluster pipeline hands errors back as replies) that say: find the
# slot's primary again and send once more.
_FOLLOW = (
    MovedError,
    AskError,
    TryAgainError,
    ClusterDownError,
    RedisConnectionError,
    RedisTimeoutError,
)
# The probe only has to outlive its WAIT; it expires on its own afterwards.
_PROBE_TTL_MS = 60_000
# Passes over one write: a NOSCRIPT (load, send again), a slot that moved or a node that
# failed over (follow it, send again), each is one more pass.
_PASSES = 8


@dataclass(frozen=True)
class Acks:
    """How many replicas must confirm an acknowledged write, and for how long to wait."""

    replicas: int = defaults.MIN_REPLICAS_ACKED
    timeout_ms: int = defaults.REPLICA_ACK_TIMEOUT_MS

    def __post_init__(self) -> None:
        if self.replicas < 0 or self.timeout_ms < 1:
            raise ConfigurationError(
                "min_replicas_acked must be >= 0 and replica_ack_timeout_ms >= 1"
                f" (got {self.replicas}, {self.timeout_ms})"
            )

    @property
    def enabled(self) -> bool:
        return self.replicas > 0


async def replicated(redis: AsyncRedis, acks: Acks, probe: str, command: tuple[Any, ...]) -> Any:
    """Run ``command`` (its first key is on ``probe``'s slot), then the probe and ``WAIT``
    on the same connection; its reply once ``acks.replicas`` replicas confirmed.

    Raises:
        NotDurableError: fewer replicas confirmed within ``acks.timeout_ms``.
        NoScriptError: ``command`` is an EVALSHA of a script the node does not have.
    """
    last: Exception | None = None
    for attempt in range(_PASSES):
        try:
            reply, _, confirmed = await _pipeline(redis, acks, probe, command)
        except RedisError as exc:
            if not isinstance(redis, aioredis.RedisCluster):
                raise  # one Redis: the pipeline was already resent by redis-py's retry
            last = exc  # a failover in progress: find the slot's primary again
            await asyncio.sleep(min(1.0, 0.05 * 2**attempt))
            continue
        moved = next((r for r in (reply, confirmed) if isinstance(r, _FOLLOW)), None)
        if moved is not None:
            # The slot moved, or its node went away (a failover): the command alone, sent
            # by the cluster client, finds the slot's owner now (a replay, if it ran);
            # then everything again there.
            last = moved
            await redis.execute_command(*command)
            continue
        if isinstance(reply, Exception):
            raise reply
        if isinstance(confirmed, Exception):
            raise confirmed
        if int(confirmed) < acks.replicas:
            raise NotDurableError(
                f"only {int(confirmed)} of {acks.replicas} replicas confirmed the write"
                f" within {acks.timeout_ms} ms; a failover could lose it: retry (it is"
                " replay-safe)",
                replicas=int(confirmed),
                wanted=acks.replicas,
                timeout_ms=acks.timeout_ms,
            )
        return reply
    assert last is not None
    raise last


async def _pipeline(
    redis: AsyncRedis, acks: Acks, probe: str, command: tuple[Any, ...]
) -> list[Any]:
    probe_set = ("SET", probe, "1", "PX", _PROBE_TTL_MS)
    wait = ("WAIT", acks.replicas, acks.timeout_ms)
    if isinstance(redis, aioredis.RedisCluster):
        # Every command pinned to the node owning the slot now: a redirection comes back
        # as a reply (allow_redirections=False) instead of moving one command alone.
        await redis.initialize()  # a no-op once the slot map is known
        node = redis.get_node_from_key(probe)
        async with redis.pipeline() as cpipe:
            for args in (command, probe_set, wait):
                cpipe.execute_command(*args, target_nodes=node)
            return await cpipe.execute(raise_on_error=False, allow_redirections=False)
    async with redis.pipeline(transaction=False) as pipe:
        for args in (command, probe_set, wait):
            pipe.execute_command(*args)
        return await pipe.execute(raise_on_error=False)


async def until_durable(write: Callable[[], Awaitable[T]], what: str) -> T:
    """``write()``, sent again while it raises NotDurableError (every write script is
    replay-safe), at most ``DURABLE_TRIES`` times; the last NotDurableError propagates."""
    for attempt in range(1, DURABLE_TRIES + 1):
        try:
            return await write()
        except NotDurableError as exc:
            if attempt == DURABLE_TRIES:
                raise
            log.warning("%s not yet durable (%s): sent again", what, exc.message)
    raise AssertionError("unreachable")

"""The leases a Redis memory holds for in-process turns, each renewed while its turn runs.

The lease is the one workers take (:mod:`convoq.redis._holding`), so a conversation has
one writer across processes whichever API writes it. The renewer of a lease stops on an
explicit signal checked after every await, and whoever stops it waits a bounded time:
it never relies on a cancellation being delivered through the Redis client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from convoq.errors import ConversationBusyError, StaleFenceError
from convoq.messages import Message
from convoq.redis._base import REDIS_UNAVAILABLE
from convoq.redis._holding import BusyWait, commit_held, reserve, unreserve
from convoq.redis._refusals import stale_fence
from convoq.redis.roles import MemoryStore

log = logging.getLogger("convoq.memory")

# A busy conversation is asked again after this long, doubling up to the cap.
_FIRST_POLL_S, _MAX_POLL_S = 0.05, 0.5
# How long stopping a renewer waits for it before leaving it cancelled.
_STOP_WAIT_S = 2.0


@dataclass
class _Held:
    fence: int
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    renewer: asyncio.Task[None] | None = None


class LeaseHolds:
    """Leases held by the turns running through one memory object (each renewed in the
    event loop that took it)."""

    def __init__(self, lease_ms: int) -> None:
        self.lease_ms = lease_ms
        self._held: dict[tuple[str, str], _Held] = {}

    async def take(
        self,
        proto: MemoryStore,
        cid: str,
        token: str,
        *,
        spent_ttl_ms: int | None,
        wait_s: float,
    ) -> None:
        """Take the lease for ``token`` (waiting up to ``wait_s`` while it is busy) and
        renew it until the turn parks, commits or is released."""
        busy_wait = BusyWait(wait_s, _FIRST_POLL_S, _MAX_POLL_S)
        while True:
            try:
                fence = await reserve(
                    proto, cid, token, lease_ms=self.lease_ms, spent_ttl_ms=spent_ttl_ms
                )
                break
            except ConversationBusyError as busy:
                await busy_wait.pause(busy)
        held = _Held(fence)
        held.renewer = asyncio.create_task(self._renew(proto, cid, held))
        self._held[(cid, token)] = held

    async def park(self, proto: MemoryStore, cid: str, token: str, ttl_ms: int) -> None:
        await self._stop(cid, token)
        await unreserve(proto, cid, token, park_ms=ttl_ms)

    async def commit(
        self, proto: MemoryStore, cid: str, token: str, messages: list[Message]
    ) -> None:
        held = await self._stop(cid, token)
        if held is None:
            raise stale_fence(cid)
        await commit_held(proto, cid, token, held.fence, messages)

    async def release(
        self, proto: MemoryStore, cid: str, token: str, spent_ttl_ms: int | None
    ) -> None:
        await self._stop(cid, token)
        await unreserve(proto, cid, token, spent_ttl_ms=spent_ttl_ms)

    async def _stop(self, cid: str, token: str) -> _Held | None:
        held = self._held.pop((cid, token), None)
        if held is None or held.renewer is None:
            return held
        renewer_loop = held.renewer.get_loop()
        if renewer_loop is not asyncio.get_running_loop():
            # Taken in another event loop (a memory serves every loop that calls it): that
            # loop stops its renewer; a closed loop has stopped it already.
            with contextlib.suppress(RuntimeError):
                renewer_loop.call_soon_threadsafe(held.stop.set)
            return held
        held.stop.set()
        done, _ = await asyncio.wait({held.renewer}, timeout=_STOP_WAIT_S)
        if not done:
            held.renewer.cancel()  # stuck in a Redis call: its lease expires on its own
        return held

    async def _renew(self, proto: MemoryStore, cid: str, held: _Held) -> None:
        period = self.lease_ms / 3000
        while not held.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(held.stop.wait(), period)
            if held.stop.is_set():
                return
            try:
                await proto.renew(cid, fence=held.fence, lease_ms=self.lease_ms)
            except StaleFenceError:
                log.warning("lost the lease on conversation %s; its turn will not be stored", cid)
                return
            except REDIS_UNAVAILABLE as exc:
                log.warning("cannot renew the lease on conversation %s now: %s", cid, exc)

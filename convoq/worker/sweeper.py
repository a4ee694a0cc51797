"""The sweeper: re-kick conversations whose turns wait with no live lease.

Celery only *kicks* a conversation; the inbox in Redis is the truth. A kick can be lost (a
worker killed with the message unacked, a broker restart, a client that died between
``submit`` and the send), and kombu would restore such a message only after the
visibility timeout. So every worker process runs this loop on its event loop: every
``interval_s`` it asks the protocol for conversations with queued turns and an absent or
expired lease and sends each a ``drain``.

A kick that merely waits (in the broker behind a backlog, or in a worker's own line of
kicks waiting for a slot) leaves no lease either, so the sweeper backs off per head: the
first pass that finds a head waiting kicks it at once, and the same head is kicked again
only once one interval has passed since, then 2, 4, 8 and at most 16 intervals
(:data:`~convoq.redis._sweeping.BACKOFF_CAP`); a head that changed starts over. The note
of each kick lives in Redis (``swept(cid)``), since another process may sweep the next
period. A pass that finds a note beside a live lease deletes it: the kick arrived, and a
crash after it is found as soon as the lease expires (a dead worker's lease lives at least
two thirds of the lease TTL, renewed every third: with the defaults, 10 s and 5 s, a pass
sees it). So recovery after a crash is bounded by lease TTL + sweep period, and a kick
lost after the sweeper already kicked that head is sent again within its backoff (at most
16 periods, plus one). Held-back kicks count in ``convoq_sweeper_kicks_held_total``.

A parked turn whose approval expired has lost its parked lease, so it is kicked too: the
worker that takes it ends it as ``expired`` (see
:meth:`TurnProtocol.sweep_candidates`), with its callback like any other. A short Redis
lock lets one process per period do the scan; the others skip it. The same pass reconciles
the queued-turn counts (:meth:`TurnProtocol.reconcile_admitted`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Awaitable, Callable

from convoq.observe import metrics
from convoq.redis._cluster import AsyncRedis
from convoq.redis._sweeping import Stranded
from convoq.redis.roles import SweepStore

log = logging.getLogger("convoq.sweeper")

Kick = Callable[[str], Awaitable[None]]


class Sweeper:
    """Periodically re-kicks stranded conversations."""

    def __init__(
        self,
        protocol: SweepStore,
        kick: Kick,
        *,
        interval_s: float,
        redis: AsyncRedis | None = None,
        lock_key: str | None = None,
        guard: Callable[[], Awaitable[None]] | None = None,
        measure: Callable[[], Awaitable[None]] | None = None,
        also: Callable[[], Awaitable[None]] | None = None,
        reconcile_grace_ms: int = 60_000,
    ) -> None:
        self._protocol = protocol
        self._kick = kick
        self._interval_s = interval_s
        self._redis = redis
        self._lock_key = lock_key
        self._guard = guard
        self._measure = measure
        self._also = also
        self._reconcile_grace_ms = reconcile_grace_ms
        self._token = f"{os.getpid()}-{random.getrandbits(32):08x}"

    async def sweep_once(self) -> list[str]:
        """One pass: kick every candidate whose backoff passed, and note the kicks; return
        the ids of those kicked (empty if another process swept in this period)."""
        if self._guard is not None:
            await self._guard()  # raises when this worker must not serve (dataset changed)
        if not await self._take_turn():
            if not await self._holding():
                # The process that sweeps reports them.
                metrics.inbox_depths_unknown()
                metrics.timers_waiting_unknown()
            return []
        if self._measure is not None:
            await self._measure()
        scan = await self._protocol.sweep_scan()
        metrics.SWEEPER_KICKS_HELD.inc(scan.held)
        kicked = await self._kick_all(scan.due)
        # Only kicks sent are noted: one that raised is tried again by the next pass.
        await self._protocol.mark_swept(kicked, interval_ms=max(1, int(self._interval_s * 1000)))
        # Turns that ended without being uncounted stop counting against the limits.
        await self._protocol.reconcile_admitted(grace_ms=self._reconcile_grace_ms)
        if self._also is not None:
            await self._also()  # the worker's own duties of the period (owed callbacks)
        return [found.cid for found in kicked]

    async def _kick_all(self, candidates: list[Stranded]) -> list[Stranded]:
        """Kick each candidate; one whose kick raises (a broker connection reconnecting,
        a queue the broker refuses) is logged and counted, and the others are still
        kicked: the next pass finds that one again. Returns those kicked."""
        kicked: list[Stranded] = []
        for found in candidates:
            cid = found.cid
            try:
                await self._kick(cid)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                metrics.SWEEPER_KICK_ERRORS.inc()
                log.warning("sweeper could not kick %s (%r); the next pass tries again", cid, exc)
                continue
            kicked.append(found)
        metrics.SWEEPER_KICKS.inc(len(kicked))
        if kicked:
            shown = [found.cid for found in kicked[:10]]
            log.info("sweeper re-kicked %d conversation(s): %s", len(kicked), shown)
        return kicked

    async def run_forever(self) -> None:
        """Sweep every ``interval_s`` (with jitter) until cancelled; errors are logged."""
        while True:
            try:
                await self.sweep_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("sweep failed; trying again next period")
            await asyncio.sleep(self._interval_s * random.uniform(0.8, 1.0))

    async def _holding(self) -> bool:
        """Whether this process holds the lock (it swept in this period)."""
        if self._redis is None or self._lock_key is None:
            return True
        holder = await self._redis.get(self._lock_key)
        token = holder.decode() if isinstance(holder, bytes) else holder
        return token == self._token

    async def _take_turn(self) -> bool:
        if self._redis is None or self._lock_key is None:
            return True
        # Held for most of a period: with N workers, one scan per period, not N.
        ttl_ms = max(1, int(self._interval_s * 800))
        taken = await self._redis.set(self._lock_key, self._token, nx=True, px=ttl_ms)
        return bool(taken)

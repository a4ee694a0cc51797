"""This worker in Redis: its entry in the workers hash (pid, queues, agents, when it was
last seen), written when its consumer is ready, refreshed before each sweep and withdrawn
at close; the sweeper that runs the periods; and, each period, the check that the dataset
is still the one the worker opened (a Redis that came back empty halts it: it stops
consuming and starts no drain, but stays up for an operator).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from celery import Celery

from convoq import mcp
from convoq.errors import ConversationMemoryError
from convoq.observe import metrics
from convoq.redis import KeySchema
from convoq.redis._cluster import AsyncRedis
from convoq.settings import ConvoqSettings
from convoq.worker import _observed
from convoq.worker._drains import Serving
from convoq.worker._event_loop import WorkerLoop
from convoq.worker._timers import TimerPoll
from convoq.worker.profiles import Profiles
from convoq.worker.sweeper import Kick, Sweeper

log = logging.getLogger("convoq.worker")


class Heartbeat:
    """This worker's entry, the sweeper and the dataset check (see the module docstring).
    ``kick`` sends a conversation a drain; ``also`` runs after each sweep."""

    def __init__(
        self,
        app: Celery,
        settings: ConvoqSettings,
        keys: KeySchema,
        profiles: Profiles,
        mcp_servers: list[Any],
        loop: WorkerLoop,
        serving: Serving,
        *,
        kick: Kick,
        also: Callable[[], Awaitable[None]],
        worker_id: str = "",
    ) -> None:
        self._app = app
        self._settings = settings
        self._keys = keys
        self._profiles = profiles
        self._mcp_servers = mcp_servers
        self._loop = loop
        self._serving = serving
        self._kick = kick
        self._also = also
        self._worker_id = worker_id
        self._announced_as: str | None = None
        self._queues: list[str] = []
        self._info: dict[str, Any] = {}
        self._metrics: metrics.MetricsServer | None = None
        self._sweeper: concurrent.futures.Future[None] | None = None
        self._timers: concurrent.futures.Future[None] | None = None

    def announce(self, hostname: str, queues: list[str]) -> None:
        """Serve metrics (with ``metrics_port``) and publish this worker and its profiles in
        Redis. The heap built until then (Celery, kombu, the profiles' modules) is frozen
        out of the garbage collector's walks: a full collection stalls every thread of the
        process, and walking that heap was most of it (``python -m bench gc``)."""
        gc.collect()
        gc.freeze()
        if self._metrics is None:
            self._metrics = _observed.serve_metrics(self._settings)
        self._loop.run(self._announce(hostname, queues))
        self._announced_as, self._queues = hostname, queues

    def start_sweeping(self) -> None:
        """Run the sweeper and the timer poll (:mod:`._timers`) on the loop until
        :meth:`stop`."""
        sweeper = self._make_sweeper()
        self._sweeper = asyncio.run_coroutine_threadsafe(
            sweeper.run_forever(), self._loop.thread.loop
        )
        timers = TimerPoll(
            self._loop.open().protocol, self._kick, interval_s=self._settings.timer_interval_s
        )
        self._timers = asyncio.run_coroutine_threadsafe(
            timers.run_forever(), self._loop.thread.loop
        )

    def sweep_once(self) -> list[str]:
        """One sweeper pass (the ``convoq.sweep`` task)."""
        return self._loop.run(self._make_sweeper().sweep_once())

    def stop(self) -> None:
        """Stop the sweeper and the metrics server."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._timers is not None:
            self._timers.cancel()
        if self._metrics is not None:
            self._metrics.close()

    async def withdraw(self, redis: AsyncRedis) -> None:
        """Remove this worker's entry, if it was announced."""
        if self._announced_as is not None:
            await redis.hdel(self._keys.workers(), self._announced_as)

    async def _announce(self, hostname: str, queues: list[str]) -> None:
        redis = self._loop.open().redis
        now = int(time.time() * 1000)
        self._info = {
            "pid": os.getpid(),
            "queues": queues,
            "partitions": self._settings.partitions,
            # Slots, and the id its runs hold leases as: running turns per worker are the
            # active leases with this holder.
            "concurrency": self._settings.concurrency,
            "worker_id": self._worker_id,
            "agents": sorted(self._profiles),
            "started_ms": now,
            "seen_ms": now,
            # Refreshed every sweep period: readers judge liveness by this worker's own.
            "heartbeat_ms": int(self._settings.sweep_interval_s * 1000),
            "frozen_objects": gc.get_freeze_count(),  # see announce
        }
        if self._metrics is not None:
            self._info["metrics_port"] = self._metrics.port
        if self._mcp_servers:
            self._info["mcp"] = mcp.health(self._mcp_servers)
        # No MULTI: the three keys sit on different cluster slots, and each write may
        # land alone (a repeated announce writes the same).
        async with redis.pipeline(transaction=False) as pipe:
            pipe.sadd(self._keys.agents(), *sorted(self._profiles))
            pipe.hset(self._keys.workers(), hostname, json.dumps(self._info))
            pipe.sadd(self._keys.prefixes(), self._keys.prefix)
            await pipe.execute()
        # Clients give the keys they write these TTLs too (redis/_retention.py).
        await self._loop.open().protocol.publish_retention()

    async def _each_period(self) -> None:
        """Before each sweep: check the dataset, then refresh this worker's entry."""
        await self._check_dataset()
        if self._announced_as is not None:
            self._info["seen_ms"] = int(time.time() * 1000)
            if self._mcp_servers:
                self._info["mcp"] = mcp.health(self._mcp_servers)
            info = json.dumps(self._info)
            await self._loop.open().redis.hset(self._keys.workers(), self._announced_as, info)

    def _make_sweeper(self) -> Sweeper:
        opened = self._loop.open()
        redis, partitions = opened.redis, self._settings.partitions
        return Sweeper(
            opened.protocol,
            self._kick,
            interval_s=self._settings.sweep_interval_s,
            redis=redis,
            lock_key=self._keys.sweeper_lock(),
            guard=self._each_period,
            measure=lambda: _observed.measure_inboxes(redis, self._keys, partitions),
            also=self._sweep_duties,
        )

    async def _sweep_duties(self) -> None:
        """After a sweep, in the one process that swept in the period: the worker's own
        duties, then the timer index repaired from a SCAN of the timers keys (a client
        that died between its two writes of a schedule left a timer without an entry),
        which also counts the turns waiting on a timer."""
        await self._also()
        waiting = await self._loop.open().protocol.repair_timer_index()
        _observed.count_timers(waiting, self._settings.partitions)

    async def _check_dataset(self) -> None:
        """Refuse to serve a Redis that came back empty (its epoch marker changed)."""
        opened = self._loop.open()
        try:
            await opened.protocol.check_epoch(opened.epoch)
        except ConversationMemoryError as exc:
            if self._serving.halted is None:
                log.critical("not serving any more: %s", exc.message)
                self._serving.halted = exc
                await asyncio.to_thread(self._stop_consuming)
            raise

    def _stop_consuming(self) -> None:
        """Leave the kicks to healthy workers; this process stays up for an operator."""
        if self._announced_as is None:
            return
        for queue in self._queues:
            self._app.control.cancel_consumer(queue, destination=[self._announced_as])

"""What one worker process holds: a long-lived event loop, the Redis protocol on it, the
runner, the sweeper, and the sender of kicks.

Celery's ``threads`` pool runs many tasks at once; each task submits its coroutine to the
process's one loop (:class:`convoq._sync.LoopThread`), so Redis and httpx connection pools
live as long as the process and many model calls are in flight per process. A drain kick
that finds a free slot skips the pool: the consumer starts it on the loop itself
(:meth:`WorkerRuntime.start_direct`, :mod:`convoq.worker._direct`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import gc
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

from celery import Celery, current_task
from kombu.exceptions import ChannelError

from convoq import mcp
from convoq._sync import LoopThread, set_blocking_threads
from convoq.compaction import compact_idle
from convoq.errors import ConfigurationError, ConversationMemoryError, UnknownTurnError
from convoq.memory.redis import RedisConversationMemory
from convoq.netguard import CallbackPolicy
from convoq.observe import metrics, tracing
from convoq.queue import routing, signing
from convoq.queue.transport import FENCE_HEADER, HEAD_HEADER
from convoq.redis import KeySchema, TurnProtocol, connect
from convoq.redis._cluster import AsyncRedis
from convoq.redis.embedded import url_or_embedded
from convoq.settings import ConvoqSettings
from convoq.summary import Summary
from convoq.worker import _observed, webhooks
from convoq.worker._fair import PREFETCH_MULTIPLIER, Kept, SlotBacklog
from convoq.worker._owed_callbacks import OwedCallbacks
from convoq.worker._shutdown import arm_exit_deadline
from convoq.worker.profiles import Profiles, load_profiles
from convoq.worker.runner import DrainReport, Runner, RunnerConfig
from convoq.worker.sweeper import Sweeper

log = logging.getLogger("convoq.worker")
T = TypeVar("T")
# Closing connections at shutdown waits this long at most.
_CLOSE_TIMEOUT_S = 5.0
# Once a warm shutdown closed everything, the process exits within this long.
_EXIT_AFTER_CLOSE_S = 2.0


class WorkerRuntime:
    """The per-process state behind the tasks (see the module docstring)."""

    def __init__(self, app: Celery, settings: ConvoqSettings) -> None:
        self.app = app
        self.settings = settings
        self.redis_url = url_or_embedded(settings.redis_url, settings.home)
        self.profiles: Profiles = load_profiles(settings.agents)
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self.keys = KeySchema(settings.prefix)
        # Parsed at start-up: a bad allow-list stops the worker, not its first webhook.
        self._callback_policy = CallbackPolicy(settings.callback_allowed_networks)
        self._loop = LoopThread("convoq-worker-loop")
        self._warm_shutdown = False  # SIGTERM came: see begin_shutdown
        # Every turn in flight may be inside a sync model function or tool at once.
        set_blocking_threads(settings.concurrency)
        self._open_lock = threading.Lock()
        self._state: tuple[AsyncRedis, TurnProtocol, Runner] | None = None
        self._sweeper: concurrent.futures.Future[None] | None = None
        self._announced_as: str | None = None
        self._queues: list[str] = []
        self._info: dict[str, Any] = {}
        self._epoch: str | None = None
        self._halted: ConversationMemoryError | None = None
        self._metrics: metrics.MetricsServer | None = None
        if settings.trace_file is not None:
            _observed.export_spans(settings.trace_file)
        self._memory: RedisConversationMemory | None = None
        self._owed: OwedCallbacks | None = None
        # Kicks start drains on the loop directly (:mod:`._direct`) once the pool's line
        # is attached; the drains so started, until they end.
        self._direct = False
        self._direct_runs: set[asyncio.Task[DrainReport]] = set()
        # Every profile's MCP servers: their health goes in the worker entry, their
        # sessions are closed at shutdown.
        servers = (s for a in self.profiles.values() for s in getattr(a, "mcp_servers", ()))
        self._mcp_servers = list({id(s): s for s in servers}.values())
        self.backlog = SlotBacklog(
            settings.concurrency,
            self._queued_kicks,
            self._requeue,
            window=settings.concurrency * PREFETCH_MULTIPLIER,
            worker_state=settings.fast_paths,
        )

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the process's loop (opening connections on first use)."""
        self._ensure_open()
        return self._loop.run(coro)

    @property
    def protocol(self) -> TurnProtocol:
        return self._ensure_open()[1]

    @property
    def runner(self) -> Runner:
        return self._ensure_open()[2]

    def _ensure_open(self) -> tuple[AsyncRedis, TurnProtocol, Runner]:
        with self._open_lock:
            if self._state is None:
                self._state = self._loop.run(self._open())
            return self._state

    async def _open(self) -> tuple[AsyncRedis, TurnProtocol, Runner]:
        s = self.settings
        # Each turn in flight holds a connection only per command; renewers and the
        # sweeper add a few. Beyond the limit commands wait for a free connection.
        redis = connect(self.redis_url, max_connections=2 * s.concurrency + 16)
        protocol = TurnProtocol.from_settings(redis, s)
        config = RunnerConfig(
            worker_id=self.worker_id,
            lease_ms=s.lease_ms,
            max_attempts=s.max_attempts,
            approval_ttl_s=s.approval_ttl_s,
            max_turn_s=s.max_turn_s,
            shutdown_grace_s=s.shutdown_grace_s,
        )
        runner = Runner(
            protocol,
            self.profiles,
            config,
            on_finished=self._after_turn,
            fairness=self.backlog,
            on_compact=self._queue_compaction,
        )
        self._epoch = await protocol.check_epoch(None)
        return redis, protocol, runner

    # -- what the tasks call ---------------------------------------------------------------
    def drain(self, conversation_id: str) -> DrainReport:
        if self._halted is not None:
            raise self._halted
        head, fence = _hints()
        return self._run_drain(conversation_id, head, fence, _kick_header(tracing.HEADER))

    def start_direct(
        self,
        cid: str,
        head: str | None,
        fence: str | None,
        traceparent: str | None,
        *,
        done: Callable[[], object],
    ) -> bool:
        """Start a drain of ``cid`` on the loop from the consumer (:mod:`._direct`) if a
        slot is free and nothing waits for it; ``done`` (the kick's acknowledgement) is
        called when it ends. False: nothing started, the kick goes Celery's way."""
        state = self._state
        if state is None or not self._direct or self._halted is not None:
            return False
        if self._warm_shutdown or not self.backlog.take_free_slot():
            return False
        try:
            self._loop.loop.call_soon_threadsafe(
                self._start_direct, state[2], cid, head, _fence(fence), traceparent, done
            )
        except RuntimeError:  # the loop is closed: shutting down
            self.backlog.release(direct=True)
            return False
        return True

    def _start_direct(
        self,
        runner: Runner,
        cid: str,
        head: str | None,
        fence: int,
        traceparent: str | None,
        done: Callable[[], object],
    ) -> None:
        drain = runner.drain(cid, head=head, fence=fence)
        task = asyncio.ensure_future(_observed.traced_drain(drain, cid, traceparent))
        self._direct_runs.add(task)
        task.add_done_callback(functools.partial(self._direct_ended, cid, done))

    def _direct_ended(
        self, cid: str, done: Callable[[], object], task: asyncio.Task[DrainReport]
    ) -> None:
        self._direct_runs.discard(task)
        self.backlog.release(direct=True)
        if task.cancelled():  # the loop stops: the kick stays unacknowledged
            return
        if (exc := task.exception()) is not None:
            # As Celery reports a task that raised; the kick is acknowledged all the same.
            log.error("drain of %s raised: %r", cid, exc, exc_info=exc)
        try:
            done()
        except Exception:
            log.exception("acknowledging the kick of %s failed", cid)

    async def _direct_ended_all(self, timeout_s: float) -> None:
        """Until every drain started directly ended, ``timeout_s`` at most."""
        if self._direct_runs:
            await asyncio.wait(set(self._direct_runs), timeout=timeout_s)

    def _drain_kept(self, kept: Kept) -> None:
        """Run a conversation this process sent back in its own line (on a pool thread)."""
        if self._halted is not None or self._warm_shutdown:
            self._requeue(*kept)  # for another worker, at once
            return
        self._run_drain(kept.conversation_id, kept.head, kept.fence, None)

    def _run_drain(
        self, cid: str, head: str | None, fence: int, trace_header: str | None
    ) -> DrainReport:
        """A drain on the process's loop, holding a slot while it runs."""
        drain = self.runner.drain(cid, head=head, fence=fence)
        with self.backlog.slot():
            return self.run(_observed.traced_drain(drain, cid, trace_header))

    def compact(self, conversation_id: str, agent: str) -> Summary | None:
        """Summarise the conversation if ``agent``'s compaction policy says so."""
        return self.run(self._compact(conversation_id, agent))

    async def _compact(self, cid: str, agent: str) -> Summary | None:
        policy = self.profiles.get_profile(agent).compaction
        if policy is None:
            return None
        if self._memory is None:
            s = self.settings
            self._memory = RedisConversationMemory(
                client=self._ensure_open()[0],
                prefix=s.prefix,
                max_attachment_bytes=s.max_attachment_bytes,
                max_turn_bytes=s.max_turn_bytes,
                conversation_ttl_s=s.conversation_ttl_s,
            )
        summary = await compact_idle(self._memory, cid, policy)
        # A turn submitted meanwhile found the conversation held and was not run: kick it
        # now rather than leave it to the sweeper.
        if await self.protocol.redis.llen(self.keys.inbox(cid)):
            await self.kick(cid)
        return summary

    async def _queue_compaction(self, cid: str, agent: str) -> None:
        await asyncio.to_thread(self.send, routing.COMPACT_TASK, cid, agent)

    def sweep_once(self) -> list[str]:
        return self.run(self._make_sweeper().sweep_once())

    def deliver_callback(self, conversation_id: str, turn_id: str) -> webhooks.Attempt:
        return self.run(self._deliver(conversation_id, turn_id))

    # -- kicks -----------------------------------------------------------------------------
    def send(
        self, task: str, conversation_id: str, *args: str, headers: dict[str, str] | None = None
    ) -> None:
        """Send ``task(conversation_id, *args)`` to the conversation's queue."""
        queue = routing.route(
            conversation_id, prefix=self.settings.prefix, partitions=self.settings.partitions
        )
        self.app.send_task(task, args=[conversation_id, *args], queue=queue, headers=headers)

    def _requeue(self, conversation_id: str, head: str, fence: int) -> None:
        headers = {HEAD_HEADER: head, FENCE_HEADER: str(fence)}
        self.send(routing.DRAIN_TASK, conversation_id, headers=headers)

    def _queued_kicks(self) -> int:
        """Messages waiting in the queues this worker consumes (broker round trips)."""
        total = 0
        with self.app.pool.acquire(block=True, timeout=5) as connection:
            channel = cast(Any, connection).default_channel
            for queue in self._queues:
                try:
                    total += channel.queue_declare(queue=queue, passive=True).message_count
                except ChannelError:  # kombu's Redis transport: no such list, no message
                    continue
        return total

    async def kick(self, conversation_id: str) -> None:
        await asyncio.to_thread(self.send, routing.DRAIN_TASK, conversation_id)

    async def _after_turn(self, cid: str, tid: str, options: dict[str, Any]) -> None:
        if self.protocol.queue_limits.counted:
            await self.protocol.unadmit_quietly(cid, tid)
        if options.get("callback_url"):
            await self._owed_callbacks().owe(cid, tid)  # before the task: nothing in between
            await asyncio.to_thread(self.send, routing.DELIVER_CALLBACK_TASK, cid, tid)

    def _owed_callbacks(self) -> OwedCallbacks:
        if self._owed is None:
            redis = self._ensure_open()[0]
            self._owed = OwedCallbacks(redis, self.keys, self.settings.webhook_redeliver_after_s)
        return self._owed

    def callback_ended(self, cid: str, tid: str, retry_in_s: float | None = None) -> None:
        """A delivery attempt of ``tid``'s callback ended: settled, or owed again in
        ``retry_in_s`` (the retry's countdown)."""
        owed = self._owed_callbacks()
        if retry_in_s is None:
            self.run(owed.settle(cid, tid))
        else:
            self.run(owed.owe(cid, tid, in_s=retry_in_s))

    async def _send_overdue_callbacks(self) -> None:
        """Send again the callbacks a dead worker held (see :mod:`._owed_callbacks`)."""
        overdue = await self._owed_callbacks().overdue()
        for cid, tid in overdue:
            await asyncio.to_thread(self.send, routing.DELIVER_CALLBACK_TASK, cid, tid)
        if overdue:
            log.warning("sent %d overdue callback(s) again: %s", len(overdue), overdue[:10])

    async def _deliver(self, cid: str, tid: str) -> webhooks.Attempt:
        secret = self.settings.webhook_secret
        if not secret:
            raise ConfigurationError(
                "a turn has a callback_url but CONVOQ_WEBHOOK_SECRET is not set on the"
                " workers: callbacks are only sent signed"
            )
        try:
            record = await self.protocol.get_turn(cid, tid)
        except UnknownTurnError:
            return webhooks.Attempt("rejected", "the turn record expired")
        url = record.options.get("callback_url")
        if not url:
            return webhooks.Attempt("rejected", "the turn has no callback_url")
        body = signing.build_payload(
            conversation_id=cid,
            turn_id=tid,
            status=record.status,
            agent=record.agent,
            text=(record.result or {}).get("text"),
            error=record.error,
            finished_ms=record.finished_ms,
            usage=(record.result or {}).get("usage"),
            finish_reason=(record.result or {}).get("finish_reason"),
            output=(record.result or {}).get("output"),
            metadata=record.metadata,
            decisions={call: d.model_dump() for call, d in record.decisions.items()},
        )
        return await webhooks.post_once(
            str(url),
            body,
            secret=secret,
            timeout_s=self.settings.webhook_timeout_s,
            policy=self._callback_policy,
        )

    # -- worker lifecycle ------------------------------------------------------------------
    def use_pool(self, consumer: object) -> None:
        """The task queue of the consumer's threads pool becomes the line conversations go
        back to (:mod:`._fair`); with any other pool, or the fast paths off, they go back
        through the broker."""
        if not self.backlog.own_line:
            log.info("fair slots: conversations go back through the broker (fast paths off)")
            return
        executor = getattr(getattr(consumer, "pool", None), "executor", None)
        window = getattr(consumer, "initial_prefetch_count", None)
        if isinstance(executor, concurrent.futures.ThreadPoolExecutor):
            window = window if isinstance(window, int) else None
            self.backlog.attach(executor.submit, self._drain_kept, window=window)
            self._direct = True
            log.info("fair slots: conversations go back in this process's line (window %s)", window)

    def announce(self, hostname: str, queues: list[str]) -> None:
        """Serve metrics (with ``metrics_port``), publish this worker and its profiles in
        Redis, then start the sweeper. The heap built until then (Celery, kombu, the
        profiles' modules) is frozen out of the garbage collector's walks: a full
        collection stalls every thread of the process, and walking that heap was most of
        it (``python -m bench gc``)."""
        gc.collect()
        gc.freeze()
        if self._metrics is None:
            self._metrics = _observed.serve_metrics(self.settings)
        self.run(self._announce(hostname, queues))
        self._announced_as, self._queues = hostname, queues
        sweeper = self._make_sweeper()
        self._sweeper = asyncio.run_coroutine_threadsafe(sweeper.run_forever(), self._loop.loop)

    async def _announce(self, hostname: str, queues: list[str]) -> None:
        redis = self._ensure_open()[0]
        now = int(time.time() * 1000)
        self._info = {
            "pid": os.getpid(),
            "queues": queues,
            "partitions": self.settings.partitions,
            "agents": sorted(self.profiles),
            "started_ms": now,
            "seen_ms": now,
            # Refreshed every sweep period: readers judge liveness by this worker's own.
            "heartbeat_ms": int(self.settings.sweep_interval_s * 1000),
            "frozen_objects": gc.get_freeze_count(),  # see announce
        }
        if self._metrics is not None:
            self._info["metrics_port"] = self._metrics.port
        if self._mcp_servers:
            self._info["mcp"] = mcp.health(self._mcp_servers)
        # No MULTI: the three keys sit on different cluster slots, and each write may
        # land alone (a repeated announce writes the same).
        async with redis.pipeline(transaction=False) as pipe:
            pipe.sadd(self.keys.agents(), *sorted(self.profiles))
            pipe.hset(self.keys.workers(), hostname, json.dumps(self._info))
            pipe.sadd(self.keys.prefixes(), self.keys.prefix)
            await pipe.execute()
        # Clients give the keys they write these TTLs too (redis/_retention.py).
        await self._ensure_open()[1].publish_retention()

    async def _each_period(self) -> None:
        """Before each sweep: check the dataset, then refresh this worker's entry."""
        await self._check_dataset()
        if self._announced_as is not None:
            self._info["seen_ms"] = int(time.time() * 1000)
            if self._mcp_servers:
                self._info["mcp"] = mcp.health(self._mcp_servers)
            info = json.dumps(self._info)
            await self._ensure_open()[0].hset(self.keys.workers(), self._announced_as, info)

    def _make_sweeper(self) -> Sweeper:
        redis, protocol, _ = self._ensure_open()
        return Sweeper(
            protocol,
            self.kick,
            interval_s=self.settings.sweep_interval_s,
            redis=redis,
            lock_key=self.keys.sweeper_lock(),
            guard=self._each_period,
            measure=lambda: _observed.measure_inboxes(redis, self.keys, self.settings.partitions),
            also=self._send_overdue_callbacks,
        )

    async def _check_dataset(self) -> None:
        """Refuse to serve a Redis that came back empty (its epoch marker changed)."""
        try:
            await self.protocol.check_epoch(self._epoch)
        except ConversationMemoryError as exc:
            if self._halted is None:
                log.critical("not serving any more: %s", exc.message)
                self._halted = exc
                await asyncio.to_thread(self._stop_consuming)
            raise

    def _stop_consuming(self) -> None:
        """Leave the kicks to healthy workers; this process stays up for an operator."""
        if self._announced_as is None:
            return
        for queue in self._queues:
            self.app.control.cancel_consumer(queue, destination=[self._announced_as])

    def begin_shutdown(self) -> None:
        """Warm shutdown began (SIGTERM): running turns finish within the grace or are
        handed back, so the pool's wait for its tasks is bounded; no new turn starts.
        Called from the signal handler of a worker process: it only schedules the change
        on the loop, and arms the process's exit deadline (:mod:`._shutdown`)."""
        s = self.settings
        self._warm_shutdown = True
        # The pool drops the jobs it has not started: conversations waiting in this
        # process's line go to the broker for other workers (a thread: this is a handler).
        self.backlog.detach()
        threading.Thread(target=self.backlog.flush, name="convoq-flush", daemon=True).start()
        arm_exit_deadline(s.shutdown_grace_s + 2 * s.lease_ms / 1000 + _CLOSE_TIMEOUT_S + 5)
        if self._state is not None:
            self._loop.loop.call_soon_threadsafe(self._state[2].begin_shutdown)

    def close(self) -> None:
        """Stop the sweeper, withdraw the worker entry and close connections."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._metrics is not None:
            self._metrics.close()
        if self._state is not None and self._direct_runs:
            # Drains started from the consumer are no pool tasks: Celery did not wait for
            # them. Shutting down, they end within the grace or hand their turn back.
            s = self.settings
            wait_s = s.shutdown_grace_s + s.lease_ms / 1000 + 1
            try:
                self._loop.run(self._direct_ended_all(wait_s), timeout=wait_s + 1)
            except Exception as exc:  # shutting down anyway
                log.warning("waiting for the running drains failed: %s", exc)
        if self._state is not None:
            try:
                self._loop.run(self._close(), timeout=_CLOSE_TIMEOUT_S)
            except Exception as exc:  # shutting down anyway
                log.warning("closing the worker's Redis connections failed: %s", exc)
        if self._warm_shutdown:
            # All that is left is the interpreter's exit, which joins threads that may
            # still run a blocking call nothing can stop.
            arm_exit_deadline(_EXIT_AFTER_CLOSE_S)

    async def _close(self) -> None:
        assert self._state is not None
        redis, protocol, _ = self._state
        if self._announced_as is not None:
            await redis.hdel(self.keys.workers(), self._announced_as)
        await protocol.close()
        await redis.aclose()
        # Stops stdio MCP servers: none outlives a worker that shuts down.
        await mcp.close_all(self._mcp_servers)


def _hints() -> tuple[str | None, int]:
    """The inbox head named by the kick this thread runs (the ``HEAD_HEADER`` a client
    sets when its turn went to an idle conversation) or None, and the fence of a lease kept
    for it by a drain that gave its slot up (``FENCE_HEADER``) or 0."""
    return _kick_header(HEAD_HEADER), _fence(_kick_header(FENCE_HEADER))


def _fence(header: str | None) -> int:
    """The fence a ``FENCE_HEADER`` names, 0 when absent or not a fence."""
    return int(header) if header and header.isdigit() and len(header) < 30 else 0


def _kick_header(name: str) -> str | None:
    """A string header of the message of the task this thread runs, or None."""
    if not current_task:  # a proxy: false outside a task
        return None
    value = getattr(current_task.request, name, None)
    return value if isinstance(value, str) else None


_lock = threading.Lock()
_current: tuple[int, WorkerRuntime] | None = None


def runtime_for(app: Celery, settings: ConvoqSettings) -> WorkerRuntime:
    """The runtime of this process (a forked pool child gets its own)."""
    global _current
    with _lock:
        if _current is None or _current[0] != os.getpid():
            _current = (os.getpid(), WorkerRuntime(app, settings))
        return _current[1]


def current_runtime() -> WorkerRuntime | None:
    """The runtime of this process if one was created."""
    if _current is not None and _current[0] == os.getpid():
        return _current[1]
    return None

"""What one worker process holds, wired together: a long-lived event loop with the Redis
protocol and the runner on it (:mod:`._event_loop`), the kicks it sends (:mod:`._kicks`),
the drains it runs (:mod:`._drains`, :mod:`._direct`), compaction (:mod:`._compaction`),
callbacks (:mod:`._owed_callbacks`, :mod:`.webhooks`), its entry in Redis and the sweeper
(:mod:`._heartbeat`), and its shutdown (:mod:`._shutdown`).

Celery's ``threads`` pool runs many tasks at once; each task submits its coroutine to the
process's one loop (:class:`convoq._sync.LoopThread`), so Redis and httpx connection pools
live as long as the process and many model calls are in flight per process. A drain kick
that finds a free slot skips the pool: the consumer starts it on the loop itself
(:meth:`DirectDrains.start`, :mod:`convoq.worker._direct`).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar, cast

from celery import Celery

from convoq._sync import set_blocking_threads
from convoq.netguard import CallbackPolicy
from convoq.redis import KeySchema
from convoq.redis.embedded import url_or_embedded
from convoq.redis.roles import WorkerStore
from convoq.settings import ConvoqSettings
from convoq.summary import Summary
from convoq.worker import _observed, webhooks
from convoq.worker._compaction import Compactor
from convoq.worker._direct import DirectDrains
from convoq.worker._drains import Drains, Serving
from convoq.worker._event_loop import WorkerLoop
from convoq.worker._fair import PREFETCH_MULTIPLIER, SlotBacklog
from convoq.worker._heartbeat import Heartbeat
from convoq.worker._kicks import Kicks
from convoq.worker._owed_callbacks import Callbacks
from convoq.worker._shutdown import Shutdown
from convoq.worker._subagents import ChildStore, SubAgents
from convoq.worker.profiles import Profiles, load_profiles
from convoq.worker.runner import DrainReport, Runner, RunnerConfig

T = TypeVar("T")


class WorkerRuntime:
    """The per-process state behind the tasks (see the module docstring): it builds the
    parts, each with its one job, and keeps the entry points the tasks and Celery's
    signals call."""

    def __init__(self, app: Celery, settings: ConvoqSettings) -> None:
        self.app = app
        self.settings = settings
        self.redis_url = url_or_embedded(settings.redis_url, settings.home)
        self.profiles: Profiles = load_profiles(settings.agents)
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self.keys = KeySchema(settings.prefix)
        # Parsed at start-up: a bad allow-list stops the worker, not its first webhook.
        callback_policy = CallbackPolicy(settings.callback_allowed_networks)
        self.loop = WorkerLoop(settings, self.redis_url, self._runner_for)
        # Every turn in flight may be inside a sync model function or tool at once.
        set_blocking_threads(settings.concurrency)
        if settings.trace_file is not None:
            _observed.export_spans(settings.trace_file)
        mcp_servers = _mcp_servers_of(self.profiles)
        self.kicks = Kicks(app, settings)
        self.backlog = SlotBacklog(
            settings.concurrency,
            self.kicks.waiting,
            self.kicks.requeue,
            window=settings.concurrency * PREFETCH_MULTIPLIER,
            worker_state=settings.fast_paths,
        )
        serving = Serving()
        self.direct = DirectDrains(self.loop, self.backlog, serving)
        self.drains = Drains(self.loop, self.backlog, self.kicks, serving, self.direct)
        self.compactor = Compactor(
            self.loop, self.kicks, self.profiles, settings, self.keys, self._kick_routed
        )
        self.callbacks = Callbacks(self.loop, self.kicks, self.keys, settings, callback_policy)
        # Made with the store, when the loop opens it (see _runner_for).
        self.subagents: SubAgents | None = None
        self._store: WorkerStore | None = None
        self.heartbeat = Heartbeat(
            app,
            settings,
            self.keys,
            self.profiles,
            mcp_servers,
            self.loop,
            serving,
            kick=self._kick_routed,
            also=self._every_sweep,
            worker_id=self.worker_id,
        )
        self.shutdown = Shutdown(
            settings, self.loop, self.backlog, serving, self.direct, self.heartbeat, mcp_servers
        )

    def _runner_for(self, protocol: WorkerStore) -> Runner:
        s = self.settings
        config = RunnerConfig(
            worker_id=self.worker_id,
            lease_ms=s.lease_ms,
            max_attempts=s.max_attempts,
            max_cut_offs=s.max_cut_offs,
            approval_ttl_s=s.approval_ttl_s,
            max_turn_s=s.max_turn_s,
            shutdown_grace_s=s.shutdown_grace_s,
            delta_flush_ms=s.delta_flush_ms,
            delta_flush_bytes=s.delta_flush_bytes,
        )
        self._store = protocol
        self.subagents = SubAgents(
            cast(ChildStore, protocol), self.profiles, self._kick_routed,
            max_depth=s.subagent_max_depth, max_fanout=s.subagent_max_fanout,
        )  # fmt: skip
        return Runner(
            protocol,
            self.profiles,
            config,
            on_finished=self._after_turn,
            fairness=self.backlog,
            on_compact=self.compactor.queue,
            on_parked=self.subagents.parked,
            children=self.subagents.children_for,
            kick_agent=self.kicks.kick_agent,
            consumed_here=self.kicks.consumed_here,
        )

    async def _kick_routed(self, conversation_id: str) -> None:
        """Kick a conversation on the queue of the pool serving its head turn's agent
        (``CONVOQ_AGENT_POOLS``; without pools, its default queue): one read more."""
        store, pools = self._store, self.settings.agent_pools
        agent = await store.head_agent(conversation_id) if store and pools else None
        if agent is None:
            await self.kicks.kick(conversation_id)
        else:
            await self.kicks.kick_agent(conversation_id, agent)

    async def _every_sweep(self) -> None:
        """The duties of the worker that sweeps in a period: owed callbacks, then the
        sub-agent calls of parked turns."""
        await self.callbacks.send_overdue()
        if self.subagents is not None:
            await self.subagents.sweep()

    async def _after_turn(self, cid: str, tid: str, options: dict[str, Any]) -> None:
        """The runner's finished hook: the turn no longer counts against the queue limits
        (when they count turns); its callback, if it has one, is owed and sent."""
        if self.protocol.queue_limits.counted:
            await self.protocol.unadmit_quietly(cid, tid)
        if options.get("callback_url"):
            await self.callbacks.owe(cid, tid)
        if self.subagents is not None:
            await self.subagents.finished(cid, tid, options)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the process's loop (opening connections on first use)."""
        return self.loop.run(coro)

    @property
    def protocol(self) -> WorkerStore:
        return self.loop.open().protocol

    @property
    def runner(self) -> Runner:
        return self.loop.open().runner

    # -- what the tasks call ---------------------------------------------------------------
    def drain(self, conversation_id: str) -> DrainReport:
        return self.drains.from_task(conversation_id)

    def compact(self, conversation_id: str, agent: str) -> Summary | None:
        """Summarise the conversation if ``agent``'s compaction policy says so."""
        return self.run(self.compactor.compact(conversation_id, agent))

    def sweep_once(self) -> list[str]:
        return self.heartbeat.sweep_once()

    def deliver_callback(self, conversation_id: str, turn_id: str) -> webhooks.Attempt:
        return self.run(self.callbacks.deliver(conversation_id, turn_id))

    def callback_ended(self, cid: str, tid: str, retry_in_s: float | None = None) -> None:
        """A delivery attempt of ``tid``'s callback ended: settled, or owed again in
        ``retry_in_s`` (the retry's countdown)."""
        self.run(self.callbacks.ended(cid, tid, retry_in_s))

    # -- kicks -----------------------------------------------------------------------------
    def send(
        self, task: str, conversation_id: str, *args: str, headers: dict[str, str] | None = None
    ) -> None:
        """Send ``task(conversation_id, *args)`` to the conversation's queue."""
        self.kicks.send(task, conversation_id, *args, headers=headers)

    async def kick(self, conversation_id: str) -> None:
        await self.kicks.kick(conversation_id)

    # -- worker lifecycle ------------------------------------------------------------------
    def use_pool(self, consumer: object) -> None:
        """The task queue of the consumer's threads pool becomes the line conversations go
        back to (:mod:`._fair`); with any other pool, or the fast paths off, they go back
        through the broker."""
        self.drains.use_pool(consumer)

    def announce(self, hostname: str, queues: list[str]) -> None:
        """Serve metrics (with ``metrics_port``), publish this worker and its profiles in
        Redis, then start the sweeper. The heap built until then is frozen out of the
        garbage collector's walks (:meth:`Heartbeat.announce` says why)."""
        self.heartbeat.announce(hostname, queues)
        self.kicks.queues = queues
        self.heartbeat.start_sweeping()

    def begin_shutdown(self) -> None:
        """Warm shutdown began (SIGTERM): running turns finish within the grace or are
        handed back; no new turn starts (:meth:`Shutdown.begin`, from a signal handler)."""
        self.shutdown.begin()

    def close(self) -> None:
        """Stop the sweeper, withdraw the worker entry and close connections."""
        self.shutdown.close()


def _mcp_servers_of(profiles: Profiles) -> list[Any]:
    """Every profile's MCP servers, each once: their health goes in the worker entry,
    their sessions are closed at shutdown."""
    servers = (s for a in profiles.values() for s in getattr(a, "mcp_servers", ()))
    return list({id(s): s for s in servers}.values())


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

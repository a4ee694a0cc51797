"""Fair slots: a drain gives its slot up after a turn while other conversations wait.

A drain runs one conversation's turns back to back, one Redis round trip per turn. That
is the fastest path for a lone busy conversation, but while every slot of the process is
held that way, kicks of other conversations wait for whole conversations to finish. So
after each turn the runner asks :meth:`Fairness.others_waiting`; when they do, its commit
keeps the lease for the next turn without taking it, and :meth:`Fairness.requeue` sends
the conversation back in line with the lease's fence as proof (the drain that picks it up
takes the kept lease). The slot then runs what waited longest.

"Others wait" means: every slot of this process runs a drain, and kicks wait for one:
conversations this process sent back in line, kicks it prefetched but has not started,
or (only when neither, at most once per ``refresh_s``) kicks in the queues it consumes,
counted through the broker. An idle or half-busy worker never asks the broker.

"Back in line" is this process's own line when it has one (:meth:`SlotBacklog.attach`,
the pool's task queue, which already holds the prefetched kicks in the order they came):
no broker round trip, and the conversation waits behind every kick this process holds,
whichever partition it came from. It is the broker (a kick carrying the fence) when the
process has no such line, or when its prefetch window is full (kicks may then wait in the
broker, and a conversation sent back must not pass them), or at shutdown. A conversation
waiting in a process's line keeps its lease only for the lease's period (nothing renews
it there): if the process dies, or the wait is longer, the lease lapses and the sweeper
kicks the conversation again, as for any stranded inbox.

Kicks that find a free slot and nobody waiting start on the process's loop at once
(:mod:`convoq.worker._direct`): they take a slot with :meth:`SlotBacklog.take_free_slot`
and give it back with :meth:`SlotBacklog.release`. Drains started by the pool (kicks that
came while every slot was busy, conversations from the line) then wait for a slot in
:meth:`SlotBacklog.slot`, in the order they came, and a kick that finds one of them
waiting goes the pool's way behind it.

The own line and the count of held kicks are a fenced shortcut: they read Celery
internals (the threads pool's ``executor``, ``celery.worker.state``'s reserved and active
requests), checked with the Celery releases in :data:`CHECKED_WITH` (:func:`enabled`).
With ``CONVOQ_FAST_PATHS`` off, or a Celery outside those releases, the worker attaches
no line and reads no worker state: a
conversation goes back through the broker, and "others wait" is the broker's count alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import NamedTuple, Protocol

from celery.worker import state

from convoq.settings import fast_path

log = logging.getLogger("convoq.worker")
CHECKED_WITH = ("celery", ">=5.4,<5.8")
"""The Celery releases whose pool and worker state this module reads: outside them
:func:`enabled` answers False (and says so once in the log)."""
# Kicks a worker process may hold unacknowledged, per slot (Celery's prefetch multiplier):
# with room for more kicks than slots, the kicks waiting for a slot wait in this process's
# line in the order they came, not in per-partition broker queues, which the consumer
# serves in turn (a conversation in a crowded partition would wait longer than one in a
# quiet partition). A killed worker's held kicks are not needed: the sweeper kicks any
# inbox without a live lease.
PREFETCH_MULTIPLIER = 4
# A pool thread waiting for a slot looks again this often (a wake-up is not counted on).
_SLOT_POLL_S = 0.5


def enabled(explicit: bool | None = None) -> bool:
    """Whether the process may keep its own line and read Celery's worker state: the fast
    paths on (``explicit``, else ``CONVOQ_FAST_PATHS``) and Celery a release of
    :data:`CHECKED_WITH`."""
    return fast_path("own line", (CHECKED_WITH,), explicit)


class Fairness(Protocol):
    """What the runner asks after each turn, and how it sends a conversation back in line."""

    async def others_waiting(self) -> bool: ...

    async def requeue(self, conversation_id: str, head: str, fence: int) -> None: ...


class NeverYield:
    """Keep every conversation to the end of its inbox (tests, in-process runners)."""

    async def others_waiting(self) -> bool:
        return False

    async def requeue(self, conversation_id: str, head: str, fence: int) -> None:
        raise RuntimeError("NeverYield never requeues")


class Kept(NamedTuple):
    """A conversation sent back in line with its lease kept: what its next drain needs."""

    conversation_id: str
    head: str
    fence: int


Send = Callable[[str, str, int], None]


class SlotBacklog:
    """Fairness for one worker process (see the module docstring).

    Args:
        slots: drains the process runs at once (its pool's concurrency).
        queued_kicks: counts the kicks waiting in the queues this process consumes
            (blocking; run in a thread).
        send: sends ``drain(cid)`` with the head and fence hints through the broker
            (blocking).
        refresh_s: how long a count is trusted.
        window: kicks the process may hold unacknowledged (slots x prefetch multiplier).
        held: how many it holds (Celery's reserved requests, running ones included).
        worker_state: whether it may read Celery's worker state (the kicks this process
            holds) and keep its own line; False (fast paths off), or a Celery outside
            :data:`CHECKED_WITH`: only the broker's count says others wait.
    """

    def __init__(
        self,
        slots: int,
        queued_kicks: Callable[[], int],
        send: Send,
        *,
        refresh_s: float = 0.05,
        window: int | None = None,
        held: Callable[[], int] = lambda: len(state.reserved_requests),
        worker_state: bool = True,
    ) -> None:
        self._slots = slots
        self._count = queued_kicks
        self._send = send
        self._refresh_s = refresh_s
        self._window = window or slots
        self._held = held
        self._worker_state = enabled(worker_state)
        self._busy = 0
        self._busy_lock = threading.Lock()
        # Pool threads waiting in slot() for one of the slots direct drains hold.
        self._freed = threading.Condition(self._busy_lock)
        self._slot_waiters = 0
        self._direct = 0  # slots held by drains started without the pool
        self._detached = False
        self._probe_lock: asyncio.Lock | None = None
        self._waiting = False
        self._fresh_until = 0.0
        # This process's own line: kept conversations, in order, and how one is started.
        self._line: deque[Kept] = deque()
        self._line_lock = threading.Lock()
        self._submit: Callable[[Callable[[], None]], object] | None = None
        self._run_kept: Callable[[Kept], None] | None = None

    @property
    def own_line(self) -> bool:
        """Whether this process may keep its own line (:meth:`attach`): the fast path on."""
        return self._worker_state

    def attach(
        self,
        submit: Callable[[Callable[[], None]], object],
        run_kept: Callable[[Kept], None],
        *,
        window: int | None = None,
    ) -> None:
        """Use the pool's task queue as this process's line: ``submit(job)`` queues a job
        behind the kicks already there; the job, on a pool thread, starts the oldest kept
        conversation with ``run_kept`` (which holds a :meth:`slot` around its drain).
        ``window``: the consumer's prefetch count, when known (it wins over the one given
        at construction: ``celery worker --prefetch-multiplier`` may have changed it)."""
        self._submit, self._run_kept = submit, run_kept
        if window:
            self._window = window

    def detach(self) -> None:
        """Stop using this process's line (shutdown): conversations go back through the
        broker; :meth:`flush` sends those still waiting in it. Drains waiting for a slot
        stop waiting (the runner starts no turn any more) within ``_SLOT_POLL_S``, at once
        after a flush."""
        # No lock taken: this runs in a signal handler, maybe while the interrupted thread
        # holds it. Waiting drains see the flag within _SLOT_POLL_S; flush wakes them.
        self._submit = None
        self._detached = True

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Around each drain the pool runs: the slot it holds counts as busy. While drains
        started without the pool hold every slot, it waits for one (pool threads are
        woken in the order they came), until :meth:`detach`."""
        with self._freed:
            crowded = self._busy >= self._slots and self._direct
            if not self._detached and (crowded or self._slot_waiters):
                self._slot_waiters += 1
                try:
                    while self._busy >= self._slots and not self._detached:
                        self._freed.wait(_SLOT_POLL_S)
                finally:
                    self._slot_waiters -= 1
            self._busy += 1
        try:
            yield
        finally:
            self.release(direct=False)

    def take_free_slot(self) -> bool:
        """Take a slot for a drain started without the pool, if one is free and nothing
        waits for it: no conversation in the line, no pool thread in :meth:`slot`, no kick
        held in the pool's queue. Give it back with ``release(direct=True)``."""
        with self._freed:
            if self._detached or self._busy >= self._slots or self._slot_waiters or self._line:
                return False
            if self._worker_state and _prefetched_here():
                return False
            self._busy += 1
            self._direct += 1
            return True

    def release(self, *, direct: bool) -> None:
        """Give a slot back; a pool thread waiting in :meth:`slot` takes it."""
        with self._freed:
            self._busy -= 1
            if direct:
                self._direct -= 1
            self._freed.notify()

    async def others_waiting(self) -> bool:
        if self._busy < self._slots:
            return False  # a free slot takes any waiting kick anyway
        if self._line or self._slot_waiters or (self._worker_state and _prefetched_here()):
            return True
        if self._probe_lock is None:
            self._probe_lock = asyncio.Lock()
        async with self._probe_lock:  # one count in flight; the others use its answer
            if time.monotonic() >= self._fresh_until:
                try:
                    self._waiting = await asyncio.to_thread(self._count) > 0
                except Exception as exc:  # no count: keep the fast path
                    log.warning("could not count the kicks waiting: %s", exc)
                    self._waiting = False
                self._fresh_until = time.monotonic() + self._refresh_s
            return self._waiting

    async def requeue(self, conversation_id: str, head: str, fence: int) -> None:
        kept = Kept(conversation_id, head, fence)
        # Drains started without the pool hold their kicks too (unacknowledged).
        if self._submit is not None and self._held() + self._direct < self._window:
            with self._line_lock:
                self._line.append(kept)
            try:
                self._submit(self._next_in_line)
                return
            except RuntimeError:  # the pool shuts down: it takes no new job
                if not self._take(kept):
                    return  # a shutdown flush sent it already
        await asyncio.to_thread(self._send, *kept)

    def _take(self, kept: Kept) -> bool:
        with self._line_lock:
            try:
                self._line.remove(kept)
            except ValueError:
                return False
            return True

    def _next_in_line(self) -> None:
        """A pool job: start the conversation that waited longest in this process's line."""
        with self._line_lock:
            if not self._line:
                return  # flushed to the broker meanwhile
            kept = self._line.popleft()
        assert self._run_kept is not None
        try:
            self._run_kept(kept)
        except Exception:  # the lease lapses; the sweeper kicks the conversation again
            log.exception("drain of %s failed", kept.conversation_id)

    def flush(self) -> None:
        """Send every conversation waiting in this process's line through the broker
        (blocking; at shutdown, so that other workers take them at once), and wake the
        drains waiting for a slot after :meth:`detach`."""
        if self._detached:
            with self._freed:
                self._freed.notify_all()
        while True:
            with self._line_lock:
                if not self._line:
                    return
                kept = self._line.popleft()
            try:
                self._send(*kept)
            except Exception as exc:  # its lease lapses; the sweeper kicks it again
                log.warning("could not send %s back to the broker: %s", kept.conversation_id, exc)


def _prefetched_here() -> bool:
    """Whether this process holds kicks it received but has not started: they wait for a
    slot as much as those in the broker."""
    return len(state.reserved_requests) > len(state.active_requests)

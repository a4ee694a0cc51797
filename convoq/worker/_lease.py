"""Holding a conversation while one of its turns runs: the lease renewed in the background,
and the turn's events buffered until its next fenced write carries them (a journal entry
per step, then commit, fail or park).

A run's lifetime is not left to cancellation: redis-py (and other libraries) swallow a
``CancelledError`` in some paths, so a renewer that only stops when cancelled can renew a
lease for ever after its turn ended. Here the renewer stops on an explicit signal
(:attr:`TurnRun.ended`), checked after every await; each renewal names the turn, so Redis
refuses one that arrives after the turn left the inbox; and :func:`with_lease` waits for
whatever it cancelled with a bound, leaving (and logging) a task that does not stop. The
same watch stops a run that was cancelled (the renewal reports the cancel flag, so a turn
stuck in one long model call stops within a lease period), one past ``max_turn_s``, and,
at warm shutdown, one that did not finish within the grace (it is handed back).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from convoq import defaults
from convoq.errors import (
    LeaseLostError,
    NotInboxHeadError,
    StaleFenceError,
    TurnCancelledError,
    TurnDeadlineError,
)
from convoq.messages import Message
from convoq.observe import metrics
from convoq.redis._base import REDIS_UNAVAILABLE
from convoq.redis.protocol import Acquired, TurnEvents
from convoq.redis.roles import LeaseStore
from convoq.turn_state import TurnState, answered
from convoq.worker._bounded import bounded, stop_bounded

log = logging.getLogger("convoq.worker")
T = TypeVar("T")

# Why a watched run stopped: its work finished, or the renewer, the deadline or shutdown.
Stop = Literal["done", "lost", "cancel", "deadline", "closing"]
# Retrying a journal write while Redis is away: first and longest pause between tries.
_RETRY_FIRST_S, _RETRY_MAX_S = 0.05, 0.5


class HandedBack(Exception):
    """The worker is shutting down and the run did not finish within the grace: it was
    stopped, and its turn is to be handed back to other workers."""


class Closing:
    """The worker's warm shutdown as its runs learn of it: set once, on the loop; each
    watched run registers a callback instead of a task waiting for it."""

    def __init__(self) -> None:
        self._set = False
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        callbacks, self._callbacks = list(self._callbacks.values()), {}
        for callback in callbacks:
            callback()

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` once shutdown begins (at once if it has); returns the way to
        stop watching."""
        if self._set:
            callback()
            return lambda: None
        key = next(self._ids)
        self._callbacks[key] = callback

        def unwatch() -> None:
            self._callbacks.pop(key, None)

        return unwatch


@dataclass(frozen=True)
class LeaseTerms:
    """How a run is held: its lease, its longest run, and the worker's shutdown (when
    ``closing`` is set, a run may go on for ``grace_s``, then it is handed back)."""

    lease_ms: int
    max_turn_s: float = defaults.MAX_TURN_S
    closing: Closing | None = None
    grace_s: float = defaults.SHUTDOWN_GRACE_S

    @property
    def period_s(self) -> float:
        """Renewal period, and how long anything cancelled is waited for."""
        return self.lease_ms / 3000


@dataclass
class TurnRun:
    """One run of a turn: its lease, the events on their way to its stream, and the
    cancel flag as last seen. ``checkpoint`` and ``should_stop`` are the turn loop's hooks.
    ``ended`` is the explicit end of the run: nothing renews its lease once it is set.
    ``confirmed_at`` (loop time) is when the lease was last known to be extended."""

    protocol: LeaseStore
    acq: Acquired
    events: TurnEvents
    lease_ms: int = defaults.LEASE_MS
    cancel_seen: bool = False
    flag_read: bool = False
    ended: bool = False
    confirmed_at: float = 0.0
    # The messages of the turn as last journaled (None: no step yet): what an interrupted
    # turn stores (double texting), whatever copy of the state its loop kept.
    journaled: list[Message] | None = None
    _end: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def end(self) -> None:
        """The run is over: from now on nothing renews its lease."""
        self.ended = True
        self._end.set()

    async def wait_end(self, timeout_s: float) -> None:
        """Until the run ends, ``timeout_s`` at most."""
        waiter = asyncio.ensure_future(self._end.wait())
        try:
            await asyncio.wait([waiter], timeout=timeout_s)
        finally:
            waiter.cancel()  # an Event.wait: no library in between, it does stop

    def lease_holds(self, margin_s: float = 0.0) -> bool:
        """Whether the lease is still ours ``margin_s`` from now, as far as we know."""
        now = asyncio.get_running_loop().time()
        return now + margin_s < self.confirmed_at + self.lease_ms / 1000

    async def while_leased(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        """``call()`` (a fenced write), retried while Redis is away and the lease holds:
        resending one is safe (a replay is refused or recognised), and giving up early
        costs more (the turn runs again once its lease lapsed)."""
        pause = _RETRY_FIRST_S
        while True:
            try:
                return await call()
            except REDIS_UNAVAILABLE as exc:
                if not self.lease_holds(margin_s=pause):
                    raise
                tid = self.acq.turn.turn_id
                log.warning(
                    "%s of turn %s failed, retrying while the lease holds: %s", what, tid, exc
                )
            await asyncio.sleep(pause)
            pause = min(2 * pause, _RETRY_MAX_S)

    async def checkpoint(self, state: TurnState) -> None:
        """Journal a finished step, with the events buffered so far. While Redis is away
        the write is retried as long as the lease holds: a step whose journal entry is
        lost runs again on the next run (a tool twice)."""
        if answered(state):
            # The commit journals a final answer: it follows at once (emits only buffer,
            # the stop check reads nothing), in the round trip this write would take.
            return
        await self.while_leased(lambda: self._journal(state), "the journal write")

    async def _journal(self, state: TurnState) -> None:
        turn = self.acq.turn
        self.journaled = list(state.messages)
        async with self.events.pending() as events:
            self.cancel_seen = await self.protocol.checkpoint(
                turn.conversation_id, turn.turn_id, fence=self.acq.fence, state=state, events=events
            )

    async def should_stop(self) -> bool:
        """Whether a cancel was requested (LeaseLostError when the lease lapsed, as far as
        this process knows). Each checkpoint and renewal reports the cancel
        flag and the commit refuses a flagged turn, so no read per step. Only a rerun or a
        resumed turn may start flagged: cancel flags running turns only, and ends a queued
        one at once. An interrupt (double texting) may flag a turn before it runs: its
        record says so, and it stops at its first boundary. Checkpoints report an
        interrupt as they report a cancel; renewals do not (the step goes on)."""
        turn = self.acq.turn
        if not self.lease_holds():
            # Woken after a pause (SIGSTOP, a stalled host) or renewals failing: another
            # worker may hold the turn now. Its writes would be refused anyway; stopping
            # here also keeps it from starting a step (a tool) the new holder runs too.
            raise LeaseLostError("the lease lapsed before the turn's next step")
        if turn.stop == "interrupt":
            return True  # flagged before this run took it (double texting): stop at once
        if not self.flag_read and (turn.attempts > 1 or self.acq.state is not None):
            self.cancel_seen = await self.protocol.is_cancel_requested(
                turn.conversation_id, turn.turn_id
            )
        self.flag_read = True
        return self.cancel_seen


@contextlib.asynccontextmanager
async def turn_run(
    protocol: LeaseStore,
    acq: Acquired,
    *,
    flush_after_s: float,
    lease_ms: int,
    text_after_s: float = defaults.DELTA_FLUSH_MS / 1000,
    text_bytes: int = defaults.DELTA_FLUSH_BYTES,
) -> AsyncIterator[TurnRun]:
    """A run of ``acq``'s turn; events still buffered when it ends are dropped (the turn
    ended, and its last write carried them, or it was abandoned). Streamed text is
    coalesced as :class:`~convoq.redis._events.TurnEvents` says (``text_after_s``,
    ``text_bytes``)."""
    turn = acq.turn
    events = TurnEvents(
        protocol,
        turn.conversation_id,
        turn.turn_id,
        flush_after_s=flush_after_s,
        text_after_s=text_after_s,
        text_bytes=text_bytes,
    )
    now = asyncio.get_running_loop().time()
    run = TurnRun(protocol, acq, events, lease_ms=lease_ms, confirmed_at=now)
    try:
        yield run
    finally:
        run.end()
        await events.close()


async def with_lease(run: TurnRun, terms: LeaseTerms, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` while the lease is renewed, and return its result. It is stopped and
    the run ends with LeaseLostError when the lease is lost, TurnCancelledError when a
    cancel was requested, TurnDeadlineError past ``max_turn_s``, HandedBack when the worker
    shuts down and the grace ran out. Whatever it cancels is waited for one renewal period
    at most; a task still running then is logged and left behind."""
    task = asyncio.ensure_future(work)
    watch = _Watch(run, terms)
    stop: Stop = "lost"
    try:
        stop = await watch.until_stopped(task)
    finally:
        watch.close()
        run.end()  # from here on nothing renews this lease, whatever is left running
        what = f"turn {run.acq.conversation_id}/{run.acq.turn.turn_id}"
        # Its writes are fenced and its lease no longer renewed: leaving it is safe.
        started: list[asyncio.Future[Any]] = [task]
        if watch.renewer is not None:
            started.append(watch.renewer)
        await stop_bounded(started, terms.period_s, what)
    if stop == "done":
        return task.result()
    raise _stopped_error(stop, run, terms)


class _Watch:
    """What may stop a run besides its work ending: the renewer (started one renewal
    period into the run, so a turn shorter than that has none), the deadline, and the
    worker's shutdown. Each wakes one future through a callback: no task waits for them."""

    def __init__(self, run: TurnRun, terms: LeaseTerms) -> None:
        self._run, self._terms = run, terms
        self._loop = asyncio.get_running_loop()
        self._woken: asyncio.Future[None] = self._loop.create_future()
        self.renewer: asyncio.Task[Stop] | None = None
        self._timers = [self._loop.call_later(terms.period_s, self._start_renewing)]
        closing = terms.closing
        self._unwatch = closing.watch(self._wake) if closing is not None else None

    def _wake(self, *_: object) -> None:
        if not self._woken.done():
            self._woken.set_result(None)

    def _start_renewing(self) -> None:
        if not self._run.ended:
            self.renewer = asyncio.ensure_future(_renew(self._run, self._terms))
            self.renewer.add_done_callback(self._wake)

    def _stopped(self, task: asyncio.Future[Any]) -> bool:
        return task.done() or (self.renewer is not None and self.renewer.done())

    async def _sleep(self, timeout_s: float, task: asyncio.Future[Any]) -> None:
        """Until the work ends, the renewer stops, shutdown begins or ``timeout_s``."""
        if self._woken.done():
            self._woken = self._loop.create_future()
        if self._stopped(task):
            return
        self._timers.append(self._loop.call_later(timeout_s, self._wake))
        await self._woken

    async def until_stopped(self, task: asyncio.Future[Any]) -> Stop:
        """Until the work ends, the renewer stops it (lease lost, cancel), the deadline
        passes, or shutdown's grace runs out."""
        terms, loop = self._terms, self._loop
        deadline = loop.time() + terms.max_turn_s
        task.add_done_callback(self._wake)
        await self._sleep(terms.max_turn_s, task)
        closing = terms.closing
        shutting_down = closing is not None and closing.is_set()
        if shutting_down and not self._stopped(task):
            # The turn may still finish within the grace, under its lease.
            await self._sleep(max(0.0, min(terms.grace_s, deadline - loop.time())), task)
        if task.done():
            return "done"
        if self.renewer is not None and self.renewer.done():
            return self.renewer.result()
        return "closing" if shutting_down and loop.time() < deadline else "deadline"

    def close(self) -> None:
        for timer in self._timers:
            timer.cancel()
        if self._unwatch is not None:
            self._unwatch()


def _stopped_error(stop: Stop, run: TurnRun, terms: LeaseTerms) -> Exception:
    if stop == "cancel":
        return TurnCancelledError("the turn was cancelled")
    if stop == "deadline":
        return TurnDeadlineError(
            f"the turn ran longer than max_turn_s ({terms.max_turn_s:g}s) and was stopped;"
            " raise CONVOQ_MAX_TURN_S if turns may take longer",
            max_turn_s=terms.max_turn_s,
            turn_id=run.acq.turn.turn_id,
        )
    if stop == "closing":
        return HandedBack()
    return LeaseLostError("the lease was lost while the turn ran")


async def _renew(run: TurnRun, terms: LeaseTerms) -> Stop:
    """Renew now, then every third of the lease, until ``run.ended``: checked after every
    await, so a cancellation swallowed inside a library cannot keep it going. Returns
    "lost" (the lease moved on, or could not be renewed before it lapsed) or "cancel" (a
    cancel was requested: the run stops now, not at its next step)."""
    loop, cid = asyncio.get_running_loop(), run.acq.conversation_id
    while not run.ended:
        sent = loop.time()
        try:
            cancel = await bounded(_renewal(run, terms.lease_ms), terms.period_s)
        except (StaleFenceError, NotInboxHeadError):
            return "lost"
        except Exception as exc:
            metrics.LEASE_RENEWAL_ERRORS.inc()
            if run.ended:
                break
            if not run.lease_holds():
                log.error("cannot renew the lease on %s: %s", cid, exc)
                return "lost"
            log.warning("renewing the lease on %s failed, retrying: %s", cid, exc)
        else:
            if run.ended:
                break
            run.confirmed_at = max(run.confirmed_at, sent)
            metrics.LEASE_RENEWALS.inc()
            if cancel:
                run.cancel_seen = True
                return "cancel"
        await run.wait_end(terms.period_s)
    return "done"


async def _renewal(run: TurnRun, lease_ms: int) -> bool:
    acq = run.acq
    return await run.protocol.renew(
        acq.conversation_id, fence=acq.fence, lease_ms=lease_ms, turn_id=acq.turn.turn_id
    )

"""The drain loop: run one conversation's queued turns, one at a time, under a lease.

``drain(cid)`` acquires the conversation's lease (``None``: nothing to do, or another
worker holds it), then loops: run the engine for the head turn while a background task
renews the lease, then commit, fail or park. Commit and fail hand back the next turn under
the same lease, so a busy conversation costs one round trip per turn. The loop ends when
the inbox is empty, a turn parks for approval, or the lease is lost (another worker took
over after this one stalled: its turn is abandoned, nothing is written).

Besides acquire, a turn's Redis round trips are its fenced writes: a journal entry
(checkpoint) per step before the final answer, then commit, fail or park. Events ride
along with the next of them (or go on their own after ``event_flush_ms``, see
:class:`~convoq.redis.protocol.TurnEvents`); checkpoints report a cancel request and the
commit refuses a cancelled turn. A one-step turn costs acquire plus commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from convoq.agent import Agent
from convoq.engine import Completed, Outcome, TurnLoop, TurnState
from convoq.errors import (
    AttachmentError,
    ConvoqError,
    InvalidMessageError,
    NotInboxHeadError,
    StaleFenceError,
    TurnAlreadyAppliedError,
    TurnCancelledError,
)
from convoq.ids import check_conversation_id
from convoq.messages import Message, MessageRole
from convoq.redis.protocol import Acquired, TurnEvents, TurnProtocol
from convoq.window import last_turns
from convoq.worker.profiles import Profiles

log = logging.getLogger("convoq.worker")
# Errors that say Redis cannot be reached (after the client's own retries), as opposed to
# errors of the turn itself.
REDIS_UNAVAILABLE = (RedisConnectionError, RedisTimeoutError)
T = TypeVar("T")

# Called after a turn finished (succeeded, failed or cancelled) with (cid, tid, options).
FinishedHook = Callable[[str, str, dict[str, Any]], Awaitable[None]]
# TurnProtocol.commit or .fail: ends the head turn, hands over the next one.
Ending = Callable[..., Awaitable[Acquired | None]]


class LeaseLostError(ConvoqError):
    """Renewing the lease failed: another worker owns the conversation now."""


@dataclass(frozen=True)
class RunnerConfig:
    """How a worker runs turns (from ConvoqSettings at start-up)."""

    worker_id: str
    lease_ms: int = 10_000
    max_attempts: int = 5
    approval_ttl_s: int = 86_400
    # How long an event may wait for the turn's next write before it is sent on its own.
    event_flush_ms: int = 10


@dataclass
class DrainReport:
    """What one drain did, for logs and tests."""

    conversation_id: str
    succeeded: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    parked: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)

    @property
    def idle(self) -> bool:
        return not (self.succeeded or self.failed or self.parked or self.abandoned)


@dataclass
class _Run:
    """One run of a turn: its lease, the events on their way to its stream, and the
    cancel flag as last seen."""

    acq: Acquired
    events: TurnEvents
    cancel_seen: bool = False
    flag_read: bool = False


def _answered(state: TurnState) -> bool:
    """The model gave its final answer: the turn loop ends with this state."""
    last = state.messages[-1]
    return last.role == MessageRole.ASSISTANT and not last.tool_calls and not state.pending


async def _no_hook(_cid: str, _tid: str, _options: dict[str, Any]) -> None:
    return None


class Runner:
    """Runs conversations' turns with the worker's profiles."""

    def __init__(
        self,
        protocol: TurnProtocol,
        profiles: Profiles,
        config: RunnerConfig,
        *,
        on_finished: FinishedHook = _no_hook,
    ) -> None:
        self._protocol = protocol
        self._profiles = profiles
        self._config = config
        self._on_finished = on_finished
        self._window = profiles.history_window()

    async def drain(self, conversation_id: str, *, head: str | None = None) -> DrainReport:
        """Run the conversation's queued turns until its inbox is empty or a turn parks.
        ``head``: the turn the kick says heads the inbox (a hint, checked in Redis)."""
        cid = check_conversation_id(conversation_id)
        report = DrainReport(cid)
        ended: list[str] = []
        acquired = await self._protocol.acquire(
            cid,
            worker_id=self._config.worker_id,
            lease_ms=self._config.lease_ms,
            window=self._window,
            max_attempts=self._config.max_attempts,
            failed=ended,
            head=head,
        )
        await self._failed_on_the_way(cid, ended, report)
        while acquired is not None:
            acquired = await self._run_turn(acquired, report)
        return report

    async def _run_turn(self, acq: Acquired, report: DrainReport) -> Acquired | None:
        turn = acq.turn
        delay = self._config.event_flush_ms / 1000
        events = TurnEvents(self._protocol, turn.conversation_id, turn.turn_id, flush_after_s=delay)
        run = _Run(acq, events)
        try:
            return await self._run(run, report)
        finally:
            await run.events.close()

    async def _run(self, run: _Run, report: DrainReport) -> Acquired | None:
        acq = run.acq
        cid, tid = acq.turn.conversation_id, acq.turn.turn_id
        try:
            outcome = await self._with_lease(acq, self._execute(run))
        except LeaseLostError:
            log.warning("lease on %s lost during turn %s: abandoned, nothing stored", cid, tid)
            report.abandoned.append(tid)
            return None
        except REDIS_UNAVAILABLE as exc:
            # The store is down, not the turn at fault: leave it queued under its lease; once
            # the lease lapses the sweeper re-kicks it and the journal skips finished steps.
            log.warning("redis unavailable during turn %s/%s (%s): left for a retry", cid, tid, exc)
            report.abandoned.append(tid)
            return None
        except Exception as exc:  # any failure ends the turn as failed; nothing is stored
            return await self._fail(run, exc, report)
        if isinstance(outcome, Completed):
            return await self._commit(run, outcome, report)
        async with run.events.pending() as events:
            await self._protocol.park(
                cid,
                tid,
                fence=acq.fence,
                state=outcome.state,
                approval_ttl_ms=self._config.approval_ttl_s * 1000,
                events=events,
            )
        report.parked.append(tid)
        return None

    async def _execute(self, run: _Run) -> Outcome:
        acq = run.acq
        turn = acq.turn
        profile = self._profiles.get_profile(turn.agent)
        cid, tid = turn.conversation_id, turn.turn_id

        async def checkpoint(state: TurnState) -> None:
            if _answered(state):
                # The commit journals a final answer: it follows at once (emits only buffer,
                # the stop check reads nothing), in the round trip this write would take.
                return
            async with run.events.pending() as events:
                run.cancel_seen = await self._protocol.checkpoint(
                    cid, tid, fence=acq.fence, state=state, events=events
                )

        async def should_stop() -> bool:
            # Each checkpoint reports the cancel flag and the commit refuses a flagged
            # turn, so no read per step. Only a rerun or a resumed turn may start flagged:
            # cancel flags running turns only, and ends a queued one at once.
            if not run.flag_read and (turn.attempts > 1 or acq.state is not None):
                run.cancel_seen = await self._protocol.is_cancel_requested(cid, tid)
            run.flag_read = True
            return run.cancel_seen

        loop = TurnLoop(
            model=profile.model,
            tools=profile.tools,
            history=await self._history(acq, profile),
            instructions=profile.instructions,
            max_steps=profile.max_steps,
            emit=run.events.add,
            checkpoint=checkpoint,
            should_stop=should_stop,
        )
        state = acq.state or TurnState.start(turn.input)
        return await loop.run(state)

    async def _history(self, acq: Acquired, profile: Agent) -> list[Message]:
        """The window this turn asks for, from what came with the lease when it suffices."""
        wanted = acq.turn.options.get("keep_last_turns")
        keep = int(wanted) if wanted is not None else profile.keep_last_turns
        if keep == self._window:
            return list(acq.history)
        if self._window and 0 < keep < self._window:
            return last_turns(list(acq.history), keep)
        return await self._protocol.history(acq.turn.conversation_id, last_turns=keep or None)

    async def _with_lease(self, acq: Acquired, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` while renewing the lease; cancel it if the lease is lost."""
        task = asyncio.ensure_future(work)
        renewer = asyncio.create_task(self._renew(acq))
        try:
            await asyncio.wait({task, renewer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost = not task.done()
            for pending in (task, renewer):
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pending
        if lost:
            raise LeaseLostError("the lease was lost while the turn ran")
        return task.result()

    async def _renew(self, acq: Acquired) -> None:
        """Renew every lease_ms/3; a transient error is retried until the lease would lapse."""
        cid, lease_ms = acq.turn.conversation_id, self._config.lease_ms
        period = lease_ms / 3000
        loop = asyncio.get_running_loop()
        renewed_at = loop.time()
        while True:
            await asyncio.sleep(period)
            try:
                await self._protocol.renew(cid, fence=acq.fence, lease_ms=lease_ms)
                renewed_at = loop.time()
            except StaleFenceError:
                return
            except Exception as exc:
                if loop.time() - renewed_at > lease_ms / 1000:
                    log.error("cannot renew the lease on %s: %s", cid, exc)
                    return
                log.warning("renewing the lease on %s failed, retrying: %s", cid, exc)

    async def _commit(self, run: _Run, outcome: Completed, report: DrainReport) -> Acquired | None:
        try:
            # A replay of our own commit (TurnAlreadyApplied) means the turn is stored.
            return await self._end(
                run,
                report,
                self._protocol.commit,
                done=report.succeeded,
                replayed=report.succeeded,
                messages=outcome.messages,
                stop_if_cancelled=True,
            )
        except (InvalidMessageError, AttachmentError, TurnCancelledError) as exc:
            # Refused before anything was written (cancelled while it ran, or too big to
            # store): it fails like any other error, and the conversation goes on.
            return await self._fail(run, exc, report)

    async def _fail(self, run: _Run, exc: Exception, report: DrainReport) -> Acquired | None:
        turn = run.acq.turn
        error = error_data(exc)
        if not isinstance(exc, TurnCancelledError):
            log.info("turn %s/%s failed: %s", turn.conversation_id, turn.turn_id, error["message"])
        return await self._end(
            run,
            report,
            self._protocol.fail,
            done=report.failed,
            replayed=report.abandoned,
            error=error,
        )

    async def _end(
        self,
        run: _Run,
        report: DrainReport,
        end: Ending,
        *,
        done: list[str],
        replayed: list[str],
        **outcome: Any,
    ) -> Acquired | None:
        """Commit or fail the head turn (``end``, with the events still buffered), then run
        the finished hook for it and for any turn the hand-off failed on the way; return
        the next turn under the lease."""
        acq = run.acq
        cid, tid = acq.turn.conversation_id, acq.turn.turn_id
        ended: list[str] = []
        config = self._config
        try:
            async with run.events.pending() as events:
                following = await end(
                    cid,
                    tid,
                    fence=acq.fence,
                    lease_ms=config.lease_ms,
                    window=self._window,
                    max_attempts=config.max_attempts,
                    failed=ended,
                    events=events,
                    **outcome,
                )
        except TurnAlreadyAppliedError:
            log.info("turn %s/%s had already ended; nothing was written", cid, tid)
            replayed.append(tid)
            return None
        except (StaleFenceError, NotInboxHeadError) as refused:
            log.warning("ending %s/%s was refused (%s): abandoned", cid, tid, refused.message)
            report.abandoned.append(tid)
            return None
        done.append(tid)
        await after_turn(self._protocol, self._on_finished, cid, tid, acq.turn.options)
        await self._failed_on_the_way(cid, ended, report)
        return following

    async def _failed_on_the_way(self, cid: str, turn_ids: list[str], report: DrainReport) -> None:
        """Turns acquire failed before they could run (over max attempts, approval
        expired): finished like any other, so their callbacks go out too."""
        for tid in turn_ids:
            log.info("turn %s/%s failed before it ran (max attempts or approval expiry)", cid, tid)
            report.failed.append(tid)
            await after_turn(self._protocol, self._on_finished, cid, tid)


async def after_turn(
    protocol: TurnProtocol,
    hook: FinishedHook,
    cid: str,
    tid: str,
    options: dict[str, Any] | None = None,
) -> None:
    """Run ``hook`` for a finished turn. ``options`` None: read from the turn's record (a
    turn a script ended on its own). A failure is logged, never raised: a lost webhook
    must not stop the conversation."""
    try:
        if options is None:
            options = (await protocol.get_turn(cid, tid)).options
        await hook(cid, tid, options)
    except Exception:
        log.exception("after-turn hook for %s/%s failed", cid, tid)


def error_data(exc: BaseException) -> dict[str, Any]:
    """The ``{type, message, details}`` stored for a failed turn."""
    if isinstance(exc, ConvoqError):
        return exc.to_data()
    return {"type": type(exc).__name__, "message": str(exc) or type(exc).__name__, "details": {}}

"""The drain loop: run one conversation's queued turns, one at a time, under a lease.

``drain(cid)`` acquires the conversation's lease (``None``: nothing to do, or another
worker holds it), then loops: run the engine for the head turn while a background task
renews the lease (:mod:`convoq.worker._lease`), then commit, fail or park. Commit and fail
hand back the next turn under the same lease: each handed-out turn comes with the id of the
turn queued behind it, which the runner passes to its commit or fail, so that turn comes
back in the same round trip and a busy conversation costs one round trip per turn. The
loop ends when the inbox is empty, a turn parks for approval, or the lease is lost
(another worker took over after this one stalled: its turn is abandoned, nothing is
written).

While other conversations wait for a slot of the process, a drain gives the slot up after
each turn instead (:mod:`convoq.worker._fair`): its commit keeps the lease for the next
turn and the conversation goes back in line with the fence as proof.

Besides acquire, a turn's Redis round trips are its fenced writes: a journal entry
(checkpoint) per step before the final answer, then commit, fail or park. Events ride
along with the next of them (or go on their own after ``event_flush_ms``, see
:class:`~convoq.redis.protocol.TurnEvents`); checkpoints report a cancel request and the
commit refuses a cancelled turn. A one-step turn costs acquire plus commit; each further
queued turn, its commit.

Double texting (:mod:`convoq.worker._interrupts`): a turn a newer message interrupted
stops before its next step and is committed as far as it went, as "interrupted"; one
rolled back ends cancelled, its error naming the turn that rolled it back.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from convoq import defaults
from convoq.context import use_scheduler
from convoq.engine import Completed, Expired, HandedOff, Outcome, Paused
from convoq.errors import (
    AttachmentError,
    InvalidMessageError,
    LeaseLostError,
    NotDurableError,
    NotInboxHeadError,
    StaleFenceError,
    TurnAlreadyAppliedError,
    TurnCancelledError,
)
from convoq.ids import check_conversation_id
from convoq.messages import Message
from convoq.observe import tracing
from convoq.profile import TurnJob
from convoq.redis._base import REDIS_UNAVAILABLE
from convoq.redis._durable import until_durable
from convoq.redis._scheduling import store_scheduler
from convoq.redis.protocol import Acquired, Handoff, Taking, TurnEnding, TurnEvents
from convoq.redis.roles import RunnerStore
from convoq.subagents import Children
from convoq.turn_state import TurnEvent, TurnState, expire_undecided
from convoq.worker import _observed
from convoq.worker._cut_offs import report_cut_off
from convoq.worker._fair import Fairness, NeverYield
from convoq.worker._finished import FinishedHook, after_turn, error_data, no_hook
from convoq.worker._handoffs import ConsumedHere, Handoffs, KickAgent
from convoq.worker._interrupts import (
    discard_if_stopped,
    interrupted_turn,
    rolled_back,
    stored_so_far,
    why_stopped,
)
from convoq.worker._lease import Closing, HandedBack, LeaseTerms, TurnRun, turn_run, with_lease
from convoq.worker._subagents import children_of, subagent_tools_of
from convoq.worker.profiles import Profiles

CompactHook = Callable[[str, str], Awaitable[None]]
"""Queues compaction of a conversation (id, agent profile name) after a stored turn."""
ParkedHook = Callable[[str, str], Awaitable[None]]
"""Called after a turn parked (conversation id, turn id): its sub-agent calls go out."""
ChildrenFor = Callable[[dict[str, Any]], Children]
"""How the sub-agent calls of a turn with these options run (child turns it parks for)."""

log = logging.getLogger("convoq.worker")

# The events of the steps a worker runs name it: which worker ran a model call or a tool
# call (the console's timeline of a turn shows it; a rerun after a takeover shows another).
SIGNED_EVENTS = frozenset({"assistant", "tool_call", "tool_result"})


class SignedEvents:
    """``events.add`` with the events of :data:`SIGNED_EVENTS` carrying ``"worker":
    worker_id``; streamed text goes to ``events`` as it is (:meth:`text`, which the turn
    loop uses when a sink has it), coalesced there without an event object per delta."""

    def __init__(self, events: TurnEvents, worker_id: str) -> None:
        self._events, self._worker = events, worker_id
        self.text = events.add_text

    async def __call__(self, event: TurnEvent) -> None:
        if event.type in SIGNED_EVENTS:
            event = TurnEvent(type=event.type, data={**event.data, "worker": self._worker})
        await self._events.add(event)


# TurnProtocol.commit_and_hand_off or .fail_and_hand_off bound to its turn and outcome:
# ends the head turn, hands over the next one.
Ending = Callable[[TurnEnding], Awaitable[Handoff]]


@dataclass(frozen=True)
class RunnerConfig:
    """How a worker runs turns (from ConvoqSettings at start-up)."""

    worker_id: str
    lease_ms: int = defaults.LEASE_MS
    max_attempts: int = defaults.MAX_ATTEMPTS
    max_cut_offs: int = defaults.MAX_CUT_OFFS
    # A profile's own approval_ttl_s wins over this one (Profiles.approval_ttls_ms).
    approval_ttl_s: int = defaults.APPROVAL_TTL_S
    # How long an event may wait for the turn's next write before it is sent on its own.
    event_flush_ms: int = defaults.EVENT_FLUSH_MS
    # How long streamed text may wait (and how much of it) before it becomes an event.
    delta_flush_ms: int = defaults.DELTA_FLUSH_MS
    delta_flush_bytes: int = defaults.DELTA_FLUSH_BYTES
    max_turn_s: float = defaults.MAX_TURN_S
    shutdown_grace_s: float = defaults.SHUTDOWN_GRACE_S


@dataclass
class DrainReport:
    """What one drain did, for logs and tests."""

    conversation_id: str
    succeeded: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    # Stored with tool results saying their approval expired (see engine.Expired).
    expired: list[str] = field(default_factory=list)
    parked: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)
    # Stopped by a newer message at a step boundary, stored as far as they went.
    interrupted: list[str] = field(default_factory=list)
    # Turns left queued for another drain: other conversations waited for a slot, or the
    # turn was handed to an agent another pool serves.
    requeued: list[str] = field(default_factory=list)

    @property
    def idle(self) -> bool:
        return not (
            self.succeeded
            or self.failed
            or self.expired
            or self.parked
            or self.abandoned
            or self.interrupted
        )


class Runner:
    """Runs conversations' turns with the worker's profiles."""

    def __init__(
        self,
        protocol: RunnerStore,
        profiles: Profiles,
        config: RunnerConfig,
        *,
        on_finished: FinishedHook = no_hook,
        fairness: Fairness | None = None,
        on_compact: CompactHook | None = None,
        on_parked: ParkedHook | None = None,
        children: ChildrenFor | None = None,
        kick_agent: KickAgent | None = None,
        consumed_here: ConsumedHere | None = None,
    ) -> None:
        self._protocol = protocol
        self._handoffs = Handoffs(protocol, profiles, kick_agent, consumed_here)
        self._on_parked = on_parked
        self._children = children
        self._on_compact = on_compact
        self._fair = fairness or NeverYield()
        self._profiles = profiles
        self._config = config
        self._on_finished = on_finished
        self._windows = profiles.windows()
        # Each profile's own approval ttl, else the worker's: decided once, like windows.
        self._approval_ttls_ms = profiles.approval_ttls_ms(config.approval_ttl_s)
        # Set at warm shutdown: no new turn starts, running ones finish within the grace
        # or are handed back.
        self._closing = Closing()
        self._terms = LeaseTerms(
            config.lease_ms,
            max_turn_s=config.max_turn_s,
            closing=self._closing,
            grace_s=config.shutdown_grace_s,
        )

    def begin_shutdown(self) -> None:
        """Warm shutdown (call on the runner's loop): take no new turn; a running one may
        finish within ``shutdown_grace_s``, then it is handed back to other workers."""
        self._closing.set()

    async def drain(
        self, conversation_id: str, *, head: str | None = None, fence: int = 0
    ) -> DrainReport:
        """Run the conversation's queued turns until its inbox is empty, a turn parks, or
        (see :mod:`convoq.worker._fair`) other conversations wait for the slot.
        ``head``: the turn the kick says heads the inbox (a hint, checked in Redis);
        ``fence``: the lease a requeueing drain kept for this one (0: take a new one)."""
        cid = check_conversation_id(conversation_id)
        report = DrainReport(cid)
        if self._closing.is_set():
            return report  # shutting down: the sweeper of a live worker kicks it again
        acquired = await self._acquire(cid, head, fence, report)
        while acquired is not None:
            if self._closing.is_set():
                await self._hand_back(acquired, report)
                break
            acquired = await self._run_turn(acquired, report)
        return report

    async def _acquire(
        self, cid: str, head: str | None, fence: int, report: DrainReport
    ) -> Acquired | None:
        config = self._config
        taking = Taking(
            config.worker_id,
            config.lease_ms,
            self._windows,
            config.max_attempts,
            fence,
            config.max_cut_offs,
        )
        with tracing.span("convoq.acquire", {"convoq.conversation_id": cid}):
            handoff = await self._protocol.take(cid, taking, head=head)
        await self._failed_on_the_way(cid, handoff.failed, report)
        return handoff.turn

    async def _cut_off(self, acq: Acquired, report: DrainReport) -> None:
        """This worker lost its run of ``acq`` while it lives: the turn is abandoned here,
        and the run reported cut off once Redis answers (:mod:`._cut_offs`: it does not
        count as a crash; a lease still the run's is freed, and the sweeper kicks the
        turn again)."""
        report.abandoned.append(acq.turn.turn_id)
        try_for_s = self._terms.period_s
        await report_cut_off(self._protocol, acq, closing=self._closing, try_for_s=try_for_s)

    async def _hand_back(self, acq: Acquired, report: DrainReport) -> None:
        """Free the lease of a turn this worker will not run (it shuts down), so another
        takes it at once; its journal stays, and it does not count as an attempt."""
        cid, tid = acq.turn.conversation_id, acq.turn.turn_id
        try:
            await self._protocol.release(cid, tid, fence=acq.fence)
        except REDIS_UNAVAILABLE as exc:  # the lease lapses by itself
            log.warning("could not hand back %s/%s (%s): its lease lapses", cid, tid, exc)
        log.info("turn %s/%s handed back: the worker is shutting down", cid, tid)
        report.abandoned.append(tid)

    async def _run_turn(self, acq: Acquired, report: DrainReport) -> Acquired | None:
        config = self._config
        with _observed.watched_turn(acq, report):
            async with turn_run(
                self._protocol,
                acq,
                flush_after_s=config.event_flush_ms / 1000,
                lease_ms=config.lease_ms,
                text_after_s=config.delta_flush_ms / 1000,
                text_bytes=config.delta_flush_bytes,
            ) as run:
                return await self._run(run, report)

    async def _run(self, run: TurnRun, report: DrainReport) -> Acquired | None:
        acq = run.acq
        cid, tid = acq.turn.conversation_id, acq.turn.turn_id
        try:
            work = self._execute(run)
            outcome = await with_lease(run, self._terms, work)
        except HandedBack:
            await self._hand_back(acq, report)
            return None
        except LeaseLostError:
            log.warning("lease on %s lost during turn %s: abandoned, nothing stored", cid, tid)
            _observed.lease_lost()
            await self._cut_off(acq, report)
            return None
        except REDIS_UNAVAILABLE as exc:
            # The store is down, not the turn at fault: the run stops, and is reported cut
            # off once Redis answers (its lease freed then, or lapsed); the next run's
            # journal skips finished steps.
            log.warning("redis unavailable during turn %s/%s (%s): left for a retry", cid, tid, exc)
            await self._cut_off(acq, report)
            return None
        except Exception as exc:  # any failure ends the turn as failed; nothing is stored
            return await self._fail(run, exc, report)
        if isinstance(outcome, Completed):
            return await self._commit(run, outcome, report)
        if isinstance(outcome, HandedOff):
            return await self._handoffs.move(run, outcome, report.requeued, report.abandoned)
        return await self._pause(run, outcome, report)

    async def _pause(self, run: TurnRun, outcome: Paused, report: DrainReport) -> Acquired | None:
        """A turn that waits (for a person, child turns or the world): parked, unless a
        newer message asked it to stop first."""
        acq = run.acq
        cid, tid = acq.turn.conversation_id, acq.turn.turn_id
        if run.cancel_seen:  # interrupted as it was to park: it ends here instead
            mode, by = await why_stopped(self._protocol, acq)
            if mode == "interrupt":
                return await self._interrupted(run, by, report)
        try:
            async with run.events.pending() as events:
                with tracing.span("convoq.park"):
                    parked = await until_durable(
                        lambda: self._protocol.park(
                            cid,
                            tid,
                            fence=acq.fence,
                            state=outcome.state,
                            approval_ttl_ms=self._approval_ttls_ms[acq.turn.agent],
                            events=events,
                            children=self._child_calls(acq.turn.agent, outcome.state),
                        ),
                        f"park of {cid}/{tid}",
                    )
        except NotDurableError as exc:
            # Parked on the primary, not confirmed by replicas: not announced; the lease
            # lapses and a rerun replays the park (or parks again after a failover).
            log.warning("park of %s/%s not durable (%s): left for a rerun", cid, tid, exc.message)
            report.abandoned.append(tid)
            return None
        except (StaleFenceError, NotInboxHeadError) as refused:
            # Another worker owns the conversation now: its run of this turn decides.
            log.warning("park of %s/%s refused (%s): abandoned", cid, tid, refused.message)
            await self._cut_off(acq, report)
            return None
        if parked == "resume":  # signals kept for its waits decided every call
            return await self._acquire(cid, tid, 0, report)
        report.parked.append(tid)
        if await discard_if_stopped(self._protocol, acq):  # double texting came first
            await after_turn(self._protocol, self._on_finished, cid, tid, acq.turn.options)
            return await self._acquire(cid, None, 0, report)
        if self._on_parked is not None:
            await self._on_parked(cid, tid)
        return None

    def _child_calls(self, agent: str, state: TurnState) -> list[str]:
        """The ids of the pending calls that wait for a child turn (sub-agent calls)."""
        tools = subagent_tools_of(self._profiles.get(agent))
        return [call.id for call in state.undecided if call.name in tools]

    async def _execute(self, run: TurnRun) -> Outcome:
        turn = run.acq.turn
        state = run.acq.state or TurnState.start(turn.input)
        if (moved := await self._handoffs.before_run(run, state, self._history)) is not None:
            return moved
        profile = self._profiles.get_profile(turn.agent)
        if turn.expired_ms is not None:  # its approval ran out: told to the model, then ended
            for event in expire_undecided(state, turn.expired_ms):
                await run.events.add(event)
        job = TurnJob(
            turn.conversation_id,
            turn.turn_id,
            turn.agent,
            state,
            await self._history(run.acq),
            emit=SignedEvents(run.events, self._config.worker_id),
            checkpoint=run.checkpoint,
            should_stop=run.should_stop,
            metadata=turn.metadata,
            attempt=max(1, turn.attempts),
            options=turn.options,
            children=self._children(turn.options) if self._children is not None else None,
            handed=turn.handed_from is not None,
        )
        with use_scheduler(store_scheduler(self._protocol)):  # ctx.schedule goes to the store
            return await profile.run_turn(job)

    async def _history(self, acq: Acquired) -> list[Message]:
        """The turn's window (:class:`~convoq.window.WindowRule`, decided with the
        windows its turns are handed out with): the one that came with the lease, unless
        the store chooses it from the counts and the summary kept with the turns."""
        rule = self._profiles.window_rule(acq.turn.agent)
        chosen = rule.for_turn(acq.turn.options, summarised=acq.summarised)
        if not chosen.store_chooses:
            return list(acq.history)
        window = chosen.window
        return window.apply(await self._protocol.window(acq.turn.conversation_id, window))

    async def _commit(
        self, run: TurnRun, outcome: Completed, report: DrainReport
    ) -> Acquired | None:
        try:
            # A replay of our own commit (TurnAlreadyApplied) means the turn is stored.
            turn = run.acq.turn
            profile = self._profiles.get(turn.agent)
            children = await children_of(
                self._protocol, profile, turn.conversation_id, turn.turn_id, outcome.messages
            )
            return await self._end(
                run,
                report,
                lambda ending: self._protocol.commit_and_hand_off(
                    turn.conversation_id,
                    turn.turn_id,
                    outcome.messages,
                    ending,
                    stop_if_cancelled=True,
                    output=outcome.output.data if outcome.output else None,
                    expired=isinstance(outcome, Expired),
                    children=children,
                ),
                done=report.expired if isinstance(outcome, Expired) else report.succeeded,
                replayed=report.succeeded,
                stored=True,
            )
        except (InvalidMessageError, AttachmentError, TurnCancelledError) as exc:
            # Refused before anything was written (cancelled while it ran, or too big to
            # store): it fails like any other error, and the conversation goes on.
            return await self._fail(run, exc, report)

    async def _interrupted(
        self, run: TurnRun, by: str | None, report: DrainReport
    ) -> Acquired | None:
        """Store the turn as far as it went, as "interrupted" (docs/double-texting.md)."""
        turn = run.acq.turn
        messages = interrupted_turn(stored_so_far(run.journaled, run.acq), by)
        try:
            return await self._end(
                run,
                report,
                lambda ending: self._protocol.commit_and_hand_off(
                    turn.conversation_id,
                    turn.turn_id,
                    messages,
                    ending,
                    stop_if_cancelled=True,
                    interrupted=True,
                ),
                done=report.interrupted,
                replayed=report.interrupted,
                stored=True,
            )
        except (InvalidMessageError, AttachmentError, TurnCancelledError) as exc:
            return await self._fail(run, exc, report)

    async def _fail(self, run: TurnRun, exc: Exception, report: DrainReport) -> Acquired | None:
        turn = run.acq.turn
        if isinstance(exc, TurnCancelledError) and exc.details.get("reason") is None:
            mode, by = await why_stopped(self._protocol, run.acq)
            if mode == "interrupt":
                return await self._interrupted(run, by, report)
            if mode == "rollback":
                exc = rolled_back(by)
        error = error_data(exc)
        _observed.failed(exc)
        if not isinstance(exc, TurnCancelledError):
            log.info("turn %s/%s failed: %s", turn.conversation_id, turn.turn_id, error["message"])
        return await self._end(
            run,
            report,
            lambda ending: self._protocol.fail_and_hand_off(
                turn.conversation_id, turn.turn_id, error, ending
            ),
            done=report.failed,
            replayed=report.abandoned,
            stored=False,
        )

    async def _end(
        self,
        run: TurnRun,
        report: DrainReport,
        end: Ending,
        *,
        done: list[str],
        replayed: list[str],
        stored: bool,
    ) -> Acquired | None:
        """Commit or fail the head turn (``end``, with the events still buffered), then run
        the finished hook for it and for any turn the hand-off failed on the way; return
        the next turn under the lease."""
        acq = run.acq
        cid, tid = acq.turn.conversation_id, acq.turn.turn_id
        config = self._config
        # Traced as one span: the script ends this turn and hands over the next.
        end = _observed.in_span("convoq.commit" if stored else "convoq.fail", end)
        requeue = await self._fair.others_waiting()
        try:
            async with run.events.pending() as events:
                ending = TurnEnding(
                    fence=acq.fence,
                    lease_ms=config.lease_ms,
                    window=self._windows,
                    max_attempts=config.max_attempts,
                    max_cut_offs=config.max_cut_offs,
                    next_turn_id=acq.next_turn_id,
                    events=events,
                    requeue=requeue,
                )
                handoff = await run.while_leased(
                    lambda: until_durable(lambda: end(ending), f"ending of {cid}/{tid}"), "ending"
                )
        except NotDurableError as exc:
            # Ended on the primary, not confirmed by replicas: no callback announces it. If
            # a failover lost the write, the turn is the running head again under a lease
            # that lapses, and a rerun ends it again; if not, it stays ended, unannounced.
            log.warning("ending %s/%s not durable (%s): left for a rerun", cid, tid, exc.message)
            report.abandoned.append(tid)
            return None
        except TurnAlreadyAppliedError:
            # Most often our own write resent after a lost reply (redis-py retries on a
            # timeout): the turn did end, so its callback is owed. A duplicate, when another
            # worker ended it, is the lesser harm (webhooks are at-least-once anyway).
            log.info("turn %s/%s had already ended; nothing was written", cid, tid)
            replayed.append(tid)
            await after_turn(self._protocol, self._on_finished, cid, tid, acq.turn.options)
            return None
        except (StaleFenceError, NotInboxHeadError) as refused:
            log.warning("ending %s/%s was refused (%s): abandoned", cid, tid, refused.message)
            await self._cut_off(acq, report)
            return None
        except REDIS_UNAVAILABLE as exc:
            # Retried while the lease held: its run is lost (if the write landed, its
            # report finds the turn ended and changes nothing).
            log.warning("ending %s/%s failed, Redis unavailable (%s): abandoned", cid, tid, exc)
            await self._cut_off(acq, report)
            return None
        done.append(tid)
        # The idle TTL of the conversation runs from its last turn.
        await self._protocol.touch(cid)
        if stored:
            await self._compact_later(cid, acq.turn.agent)
        await after_turn(self._protocol, self._on_finished, cid, tid, acq.turn.options)
        await self._failed_on_the_way(cid, handoff.failed, report)
        if handoff.requeued is not None:
            return await self._requeue(cid, handoff.requeued, acq.fence, report)
        return handoff.turn

    async def _requeue(
        self, cid: str, head: str, fence: int, report: DrainReport
    ) -> Acquired | None:
        """Send the conversation back in line (its lease kept for the next drain); if the
        kick cannot be sent, go on with the turn here instead."""
        try:
            await self._fair.requeue(cid, head, fence)
        except Exception as exc:
            log.warning("could not requeue %s (%s): its next turn runs here", cid, exc)
            return await self._acquire(cid, head, fence, report)
        report.requeued.append(head)
        return None

    async def _compact_later(self, cid: str, agent: str) -> None:
        """A profile with a compaction policy gets a compact task queued behind the turn
        (the task checks the threshold and holds the conversation while it summarises)."""
        profile = self._profiles.get(agent)
        if self._on_compact is not None and profile is not None and profile.compaction:
            try:
                await self._on_compact(cid, agent)
            except Exception as exc:  # the turn is stored: a lost compaction comes again
                log.warning("could not queue compaction of %s: %s", cid, exc)

    async def _failed_on_the_way(
        self, cid: str, turn_ids: tuple[str, ...], report: DrainReport
    ) -> None:
        """Turns acquire failed before they could run (over max attempts): finished like
        any other, so their callbacks go out too."""
        for tid in turn_ids:
            log.info("turn %s/%s failed before it ran (over max attempts)", cid, tid)
            report.failed.append(tid)
            await after_turn(self._protocol, self._on_finished, cid, tid)

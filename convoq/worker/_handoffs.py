"""Handoffs on workers (:mod:`convoq.handoffs`): a turn handed to another agent goes on
here when this worker serves that agent's profile, else it is queued again for the pool
that does (``CONVOQ_AGENT_POOLS``).

Both go through the ``transfer`` script, fenced like a checkpoint: the step journal keeps
the finished steps (the handoff's among them) and the turn record's agent changes in the
same call; to queue it again the same call frees the lease, then the conversation is
kicked on the agent's pool queue. The turn stays its conversation's inbox head all along,
so a worker killed between those steps loses nothing: the sweeper finds a head without a
live lease and kicks it on the queue of the agent its record names now.

A turn that reaches a worker which does not serve its agent, and whose agent's pool this
worker does not consume, is passed on the same way (as the turn a handoff queued again).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

from convoq.engine import HandedOff
from convoq.errors import NotInboxHeadError, StaleFenceError, TurnAlreadyAppliedError
from convoq.handoffs import continues_as, handoffs_of
from convoq.messages import Message
from convoq.profile import AgentProfile
from convoq.redis._base import REDIS_UNAVAILABLE
from convoq.redis.protocol import Acquired
from convoq.redis.roles import RunnerStore
from convoq.turn_state import TurnEvent, TurnState
from convoq.worker._lease import TurnRun

log = logging.getLogger("convoq.worker")

KickAgent = Callable[[str, str], Awaitable[None]]
"""Kicks a conversation on the queue of the pool serving an agent (conversation, agent)."""
HistoryOf = Callable[[Acquired], Awaitable[list[Message]]]
"""The history window a turn runs with (the runner's, as its profile's rule says)."""
ConsumedHere = Callable[[str, str], bool]
"""Whether this worker consumes the queue an agent's turns of a conversation go to."""


class Handoffs:
    """A worker's side of handoffs: where a turn goes on, and the move there."""

    def __init__(
        self,
        protocol: RunnerStore,
        profiles: Mapping[str, AgentProfile],
        kick: KickAgent | None,
        consumed_here: ConsumedHere | None,
    ) -> None:
        self._protocol = protocol
        self._profiles = profiles
        self._kick = kick
        self._consumed_here = consumed_here

    async def before_run(
        self, run: TurnRun, state: TurnState, history: HistoryOf
    ) -> HandedOff | None:
        """The move a turn makes before it runs: to another pool, for an agent served
        elsewhere; or, for a new turn of an agent that handed the conversation off, to the
        agent that answered its last turn (:func:`~convoq.handoffs.continues_as`; a
        ``handoff`` event without a ``call_id`` says so)."""
        moved = await self._before_run(run.acq, state, history)
        if moved is not None and moved.target != run.acq.turn.agent:
            data = {"call_id": None, "from": run.acq.turn.agent, "to": moved.target}
            await run.events.add(TurnEvent(type="handoff", data=data))
        return moved

    async def _before_run(
        self, acq: Acquired, state: TurnState, history: HistoryOf
    ) -> HandedOff | None:
        agent = acq.turn.agent
        profile = self._profiles.get(agent)
        if profile is None:
            elsewhere = self._consumed_here is not None and not self._consumed_here(
                acq.turn.conversation_id, agent
            )
            return HandedOff(state, agent) if elsewhere and self._kick else None
        if state.steps or acq.state is not None or not handoffs_of(getattr(profile, "tools", None)):
            return None
        target = continues_as(profile, await history(acq), self._profiles.get)
        return HandedOff(state, target) if target is not None else None

    async def move(
        self, run: TurnRun, outcome: HandedOff, requeued: list[str], abandoned: list[str]
    ) -> Acquired | None:
        """Journal the handoff and set the turn's agent; return the turn to go on with
        here (this worker serves the agent), else None: queued again for its pool (its id
        added to ``requeued``) or, refused, left to the run that owns it (``abandoned``)."""
        acq = run.acq
        cid, tid, target = acq.turn.conversation_id, acq.turn.turn_id, outcome.target
        here = target in self._profiles
        try:
            async with run.events.pending() as events:
                await self._protocol.transfer(
                    cid, tid, fence=acq.fence, state=outcome.state, agent=target,
                    release=not here, events=events,
                )  # fmt: skip
        except (StaleFenceError, NotInboxHeadError, TurnAlreadyAppliedError) as refused:
            log.warning("handoff of %s/%s refused (%s): abandoned", cid, tid, refused.message)
            abandoned.append(tid)
            return None
        except REDIS_UNAVAILABLE as exc:  # its lease lapses; the journal holds what ran
            log.warning("handoff of %s/%s failed, Redis unavailable (%s)", cid, tid, exc)
            abandoned.append(tid)
            return None
        if here:
            moved = target != acq.turn.agent
            handed = acq.turn.handed_from or (acq.turn.agent if moved else None)
            turn = replace(acq.turn, agent=target, handed_from=handed)
            return replace(acq, turn=turn, state=outcome.state)
        log.info("turn %s/%s handed to %s: queued for its pool", cid, tid, target)
        requeued.append(tid)
        if self._kick is not None:
            try:
                await self._kick(cid, target)
            except Exception as exc:  # the sweeper kicks it on the right queue
                log.warning("could not kick %s for %s (%s): the sweeper will", cid, target, exc)
        return None

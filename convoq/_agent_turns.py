"""An in-process :class:`~convoq.agent.Agent`'s turns against its memory: a turn starts by
reserving its conversation and loading the history window, runs the turn loop, and
finishes by parking for approval, committing the whole turn (then compacting), or releasing
the conversation when it stores nothing. A turn that uses no memory (none on the agent, no
conversation, or a GenerationRequest) runs the same, every memory step skipped.

The Agent takes no lock of its own: the memory's ``areserve``, ``apark``,
``acommit_turn`` and ``arelease`` decide what "one writer" spans.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Protocol

from convoq import _agent_handoffs
from convoq._agent_continuations import (
    AgentInput,
    approval_ttl,
    awaiting_approval,
    held_s,
    opening,
    parked,
    valid_until,
)
from convoq._agent_options import Asked, ConversationOwner, Limits, call_window
from convoq.agent_response import ChildTurnData, Continuation, Response
from convoq.compaction import CompactionPolicy, compact_idle
from convoq.context import Scheduler, use_scheduler
from convoq.engine import Completed, EventSink
from convoq.errors import ConversationMemoryError, ConvoqError
from convoq.memory.base import ConversationMemory
from convoq.messages import Message
from convoq.output import OutputShape
from convoq.subagents import ChildrenMade
from convoq.window import WindowRule, WindowSettings

# The Agent's logger: these warnings are the Agent's, wherever its code lives.
log = logging.getLogger("convoq.agent")


class TurnOwner(ConversationOwner, WindowSettings, Protocol):
    """What an agent's turns in process read of it, when they start and as they finish."""

    @property
    def approval_ttl_s(self) -> float | None: ...

    @property
    def compaction(self) -> CompactionPolicy | None: ...


class AgentTurns:
    """Starts, resumes, finishes and discards the turns of one agent in process. Made for
    each call and kept by none (the agent holds no cycle); the agent's attributes are read
    as the turn goes, so they may be set after the agent is made."""

    def __init__(self, agent: TurnOwner) -> None:
        self._agent = agent

    async def start(
        self,
        input: AgentInput,
        conversation_id: str | None,
        limits: Limits,
        emit: EventSink,
        asked: Asked,
    ) -> Response:
        """Run a new turn: the call's window and conversation (else the agent's)."""
        agent = self._agent
        window = call_window(agent, limits)
        cid = conversation_id if conversation_id is not None else agent.conversation_id
        cont = opening(
            input,
            conversation_id=cid,
            agent=agent.name,
            has_memory=agent.memory is not None,
            window=window,
            asked=asked,
            metadata=limits.metadata,
        )
        return await self.run(cont, emit, asked.shape, resume=False)

    async def run(
        self, cont: Continuation, emit: EventSink, shape: OutputShape | None, *, resume: bool
    ) -> Response:
        """Reserve the turn's conversation (a resume: with its token, kept spent until it
        expires), load its history window, then run and finish the turn."""
        await self._claim(cont, resume=resume)
        try:
            # Not kept in the continuation: the history cannot change while reserved.
            history = await self._load_history(cont) if cont.uses_memory else cont.history
        except BaseException:
            await self._release(cont)
            raise
        return await self._finish(cont, history, emit, shape)

    async def discard(self, cont: Continuation) -> None:
        """Drop a paused turn: nothing is stored and its conversation is free again."""
        if (stored := self._memory_of(cont)) is not None:
            memory, cid = stored
            await memory.arelease(cid, cont.token, spent_until_ms=self._valid_until(cont))

    async def _finish(
        self,
        cont: Continuation,
        history: list[Message],
        emit: EventSink,
        shape: OutputShape | None,
    ) -> Response:
        """Run the loop under the turn's reservation, then park, store or release."""
        agent = self._agent
        try:
            with ChildrenMade() as made, use_scheduler(self._scheduler_of(cont)):
                outcome, answered = await _agent_handoffs.run_turn(
                    agent, cont, history, shape, emit
                )
        except BaseException:
            await self._release(cont)
            raise
        if not isinstance(outcome, Completed):
            # Paused: the conversation stays reserved until resume, discard or the ttl.
            paused = parked(cont, outcome, approval_ttl(agent.approval_ttl_s))
            await self._park(paused)
            return awaiting_approval(paused)
        response = Response(
            text=outcome.text, turn=outcome.messages, status="completed",
            conversation_id=cont.conversation_id, usage=outcome.usage + made.usage,
            finish_reason=outcome.finish_reason, refusal=outcome.refusal,
            output=outcome.output.value if outcome.output else None,
            output_data=outcome.output.data if outcome.output else None,
            children=[ChildTurnData(**asdict(child)) for child in made.children],
            agent=getattr(answered, "name", None),
        )  # fmt: skip
        await self._store(cont, outcome.messages, response)
        await self._compact(cont)
        return response

    async def _load_history(self, cont: Continuation) -> list[Message]:
        stored = self._memory_of(cont)
        if stored is None:
            return []
        memory, cid = stored
        # The window decided when the turn started, kept in the continuation: a resume
        # sends what the start sent, whatever the agent that resumes it says.
        decided = WindowRule(
            cont.keep_last_turns, cont.max_history_tokens, counter=self._agent.token_counter
        )
        window = decided.window()
        try:
            loaded = await memory.aload_window(cid, window)
        except ConvoqError:
            raise
        except Exception as exc:
            raise ConversationMemoryError(
                f"loading conversation {cid!r} failed ({exc}); the model was not called",
                conversation_id=cid,
            ) from exc
        # Again here: a custom memory's load may ignore the window (trimming twice is harmless).
        return window.apply(loaded)

    async def _store(self, cont: Continuation, turn: list[Message], response: Response) -> None:
        stored = self._memory_of(cont)
        if stored is None:
            return
        memory, cid = stored
        try:
            await memory.acommit_turn(cid, cont.token, turn)
        except Exception as exc:
            await self._release(cont)
            raise ConversationMemoryError(
                f"the model answered but storing the turn failed ({exc}); the answer is in"
                " this error's .response; retry the turn once the memory works again",
                response=response,
                conversation_id=cid,
            ) from exc

    async def _compact(self, cont: Continuation) -> None:
        """Inline compaction after a stored turn: its failure never fails the turn."""
        stored = self._memory_of(cont)
        policy = self._agent.compaction
        if policy is None or stored is None:
            return
        try:
            await compact_idle(stored[0], stored[1], policy)
        except Exception as exc:
            log.warning("compaction of %s failed (%s); the turn is stored", stored[1], exc)

    def _scheduler_of(self, cont: Continuation) -> Scheduler | None:
        """How ``ctx.schedule`` stores a follow-up: through a memory with durable timers
        (Redis), else it cannot (and says so)."""
        stored = self._memory_of(cont)
        make = getattr(stored[0], "timer_scheduler", None) if stored is not None else None
        return make() if callable(make) else None

    def _memory_of(self, cont: Continuation) -> tuple[ConversationMemory, str] | None:
        """The memory and conversation a turn reads and writes, or None when it uses none."""
        memory = self._agent.memory
        if cont.uses_memory and memory is not None and cont.conversation_id is not None:
            return memory, cont.conversation_id
        return None

    async def _claim(self, cont: Continuation, *, resume: bool) -> None:
        if (stored := self._memory_of(cont)) is not None:
            agent = self._agent
            wait = agent.busy_timeout_s if agent.if_busy == "wait" else 0.0
            until = self._valid_until(cont) if resume else None
            await stored[0].areserve(stored[1], cont.token, resume_until_ms=until, wait_s=wait)

    async def _park(self, cont: Continuation) -> None:
        if (stored := self._memory_of(cont)) is not None:
            ttl_s = held_s(cont, approval_ttl(self._agent.approval_ttl_s))
            try:
                await stored[0].apark(stored[1], cont.token, ttl_s=ttl_s)
            except BaseException:
                await self._release(cont)
                raise

    async def _release(self, cont: Continuation) -> None:
        """Free the conversation of a turn that stores nothing. A failure here must not
        hide the turn's own error: a lease the store could not free expires by itself."""
        if (stored := self._memory_of(cont)) is not None:
            try:
                await stored[0].arelease(stored[1], cont.token)
            except Exception as exc:
                log.warning("could not free conversation %s: %s", stored[1], exc)

    def _valid_until(self, cont: Continuation) -> int:
        return valid_until(cont, approval_ttl(self._agent.approval_ttl_s))

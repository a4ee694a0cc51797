"""An in-process turn that hands off: the loop of the agent the turn is handed to goes on
with the same state, in this process (:mod:`convoq.handoffs`), until the turn completes
or pauses. A new turn of an agent that handed the conversation off runs as the agent it
was handed to (:func:`~convoq.handoffs.continues_as`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from convoq._agent_options import loop_of
from convoq.agent_response import Continuation
from convoq.context import TurnScope
from convoq.engine import Completed, EventSink, HandedOff, Paused
from convoq.errors import ConfigurationError
from convoq.handoffs import continues_as, find
from convoq.messages import Message
from convoq.output import OutputShape


def _lookup(start: Any) -> Any:
    return lambda name: find(start, name)


async def run_turn(
    start: Any,
    cont: Continuation,
    history: list[Message],
    shape: OutputShape | None,
    emit: EventSink,
) -> tuple[Completed | Paused, Any]:
    """Run the turn from ``cont.state``, as ``start`` or the agents it hands off to;
    return the outcome and the agent that reached it.

    Raises:
        ConfigurationError: a handoff names an agent not among ``start``'s handoffs.
    """
    agent = start
    if not cont.state.steps and (name := continues_as(start, history, _lookup(start))):
        agent = find(start, name)
    while True:
        deps = await agent.provided_deps()
        scope = TurnScope(cont.conversation_id, cont.token, agent.name, deps, cont.metadata)
        own = agent is start
        settings = cont.model_settings if own else agent.model_settings
        loop = loop_of(agent, history, scope, settings, shape if own else agent.output, emit)
        outcome = await replace(loop, handed=not own).run(cont.state)
        if not isinstance(outcome, HandedOff):
            return outcome, agent
        agent = find(start, outcome.target)
        if agent is None:
            raise ConfigurationError(
                f"the turn was handed to {outcome.target!r}, which is no agent that"
                f" {start.name!r} hands off to (handoffs)",
                option="handoffs",
                profile=outcome.target,
            )

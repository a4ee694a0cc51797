"""The in-process :class:`~convoq.agent.Agent` as a worker's profile
(:class:`~convoq.profile.AgentProfile`): a queued turn's run, what the turn asks of the
model, and the options set on the agent that workers cannot honour. A worker keeps the
conversation and journals each step; the agent only runs its loop.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

from convoq._agent_options import (
    DEFAULT_BUSY_TIMEOUT_S,
    AgentOptions,
    ConversationOwner,
    loop_of,
    tool_names,
)
from convoq.context import TurnScope
from convoq.engine import Outcome
from convoq.model_settings import ModelSettings, check_tool_choice, coerce_settings, merge_settings
from convoq.output import OutputShape, shape_for, spec_from_data
from convoq.profile import TurnJob


class ProfileOwner(ConversationOwner, Protocol):
    """What a worker's run of a turn, and its check of a profile, read of an agent."""


async def run_turn(agent: ProfileOwner, job: TurnJob) -> Outcome:
    """Run a worker's turn of ``agent`` on from ``job.state``."""
    deps = await agent.provided_deps()
    scope = TurnScope(
        job.conversation_id, job.turn_id, job.agent, deps, job.metadata, attempt=job.attempt
    )
    settings, output = asked_of(agent, job.options)
    loop = loop_of(agent, job.history, scope, settings, output, job.emit)
    # The worker's journal and cancellation, on top of what every run of a turn gets.
    loop = replace(loop, checkpoint=job.checkpoint, should_stop=job.should_stop, handed=job.handed)
    if job.children is not None:
        loop = replace(loop, children=job.children)
    return await loop.run(job.state)


def asked_of(
    agent: AgentOptions, options: dict[str, Any]
) -> tuple[ModelSettings | None, OutputShape | None]:
    """A queued turn's settings (the agent's, the turn's merged over them) and output
    shape (the turn's, else the agent's), checked again: they come from outside."""
    settings = merge_settings(agent.model_settings, coerce_settings(options.get("model_settings")))
    check_tool_choice(settings, tool_names(agent))
    data = options.get("output")
    if data is None:
        return settings, agent.output
    # The agent's own type when the spec is its own: validated by its class.
    return settings, shape_for(spec_from_data(data).spec, agent.output)


def worker_refusals(agent: ProfileOwner) -> dict[str, str]:
    """The options set on ``agent`` that workers cannot honour, each with what to do."""
    refused: dict[str, str] = {}
    if agent.memory is not None:
        refused["memory"] = (
            "workers keep every conversation in their Redis store (CONVOQ_REDIS_URL),"
            " never in an Agent's memory"
        )
    if agent.conversation_id is not None:
        refused["conversation_id"] = "each queued turn names its own conversation"
    busy = (
        "queued turns of a busy conversation wait in its inbox; say what a submit"
        " does with client.submit(if_busy=...)"
    )
    if agent.if_busy != "reject":
        refused["if_busy"] = busy
    if agent.busy_timeout_s != DEFAULT_BUSY_TIMEOUT_S:
        refused["busy_timeout_s"] = busy
    return refused

"""Agent profiles whose tools fail, for worker tests of what operators and the model see
(CONVOQ_AGENTS=tests.support.tool_error_agents). Scripted models only."""

from __future__ import annotations

from convoq import Agent, RunContext, ToolFailure, tool
from convoq.models import ScriptedModel
from tests.support.models import call_tool_then_answer


@tool
def explode(ctx: RunContext[None]) -> str:
    """Fails the way a bug does: a plain exception."""
    raise RuntimeError(f"disk on fire in {ctx.turn_id}")


@tool
def refuse(city: str) -> str:
    """Fails with words chosen for the model."""
    raise ToolFailure(f"no weather for {city}; ask for a city nearby")


tool_raiser = Agent(
    ScriptedModel(call_tool_then_answer("explode", {})), name="tool_raiser", tools=[explode]
)
tool_refuser = Agent(
    ScriptedModel(call_tool_then_answer("refuse", {"city": "Atlantis"})),
    name="tool_refuser",
    tools=[refuse],
)

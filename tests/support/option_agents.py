"""Profiles for the tests of per-turn options and profile options on workers
(CONVOQ_AGENTS=tests.support.option_agents).

- ``refunds`` (``approval_ttl_s=20``), ``refunds_quick`` (``approval_ttl_s=2``) and
  ``refunds_default`` (no ttl of its own: the worker's) ask for ``refund``, which needs
  approval; each run of it is recorded under ``{prefix}:test:refunds``.
- ``looper`` asks for ``noop`` on every step (``max_steps=2``); ``counted`` answers with
  the user texts it was sent, its history within ``max_history_tokens=100`` as counted by
  ``token_counter`` (a text with ``heavy`` costs 1000); ``with_deps`` answers with what
  its tool read as ``ctx.deps`` (``deps="the-deps"``).
- ``pai-options`` (Pydantic AI) first calls ``peek`` (which returns ``ctx.metadata``),
  then answers with what it saw: the model settings it was sent and the metadata, as JSON
  text, or with an output tool's arguments when the run asks for structured output. A
  prompt with ``misfit`` answers ``tenant`` as a number first (``always misfit``: every
  time).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_ai import Agent as PaiAgent
from pydantic_ai import RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from convoq import Agent, Message, ToolCall, tool
from convoq import RunContext as ConvoqContext
from convoq.messages import MessageRole
from convoq.models import ModelRequest as ConvoqRequest
from convoq.models import ScriptedModel
from convoq.tokens import TokenizerCounter
from tests.support.worker_agents import test_key, test_redis


@tool(requires_approval=True)
def refund(amount: int) -> str:
    """Pay money back (a person approves each refund)."""
    test_redis().rpush(test_key("refunds"), str(amount))
    return f"refunded {amount}"


def refund_fn(request: ConvoqRequest) -> str | Message:
    """Asks for one refund per turn, then reports the tool result."""
    last = request.messages[-1]
    if last.role == MessageRole.TOOL:
        return f"after tool: {last.text}"
    call = ToolCall(id=f"refund-{len(request.messages)}", name="refund", arguments={"amount": 35})
    return Message(role=MessageRole.ASSISTANT, tool_calls=[call])


refunds = Agent(ScriptedModel(refund_fn), name="refunds", tools=[refund], approval_ttl_s=20)
refunds_quick = Agent(
    ScriptedModel(refund_fn), name="refunds_quick", tools=[refund], approval_ttl_s=2
)
refunds_default = Agent(ScriptedModel(refund_fn), name="refunds_default", tools=[refund])


@tool
def noop() -> str:
    """Does nothing."""
    return "nothing"


def loop_fn(request: ConvoqRequest) -> Message:
    call = ToolCall(id=f"noop-{len(request.messages)}", name="noop")
    return Message(role=MessageRole.ASSISTANT, tool_calls=[call])


looper = Agent(ScriptedModel(loop_fn), name="looper", tools=[noop], max_steps=2)


def users_fn(request: ConvoqRequest) -> str:
    return " | ".join(m.text for m in request.messages if m.role == MessageRole.USER)


counted = Agent(
    ScriptedModel(users_fn),
    name="counted",
    max_history_tokens=100,
    token_counter=TokenizerCounter(lambda text: 1000 if "heavy" in text else 1),
)


@tool
def whose(ctx: ConvoqContext[str]) -> str:
    """Whose deps the run has."""
    return ctx.deps


def deps_fn(request: ConvoqRequest) -> str | Message:
    last = request.messages[-1]
    if last.role == MessageRole.TOOL:
        return f"deps: {last.text}"
    return Message(role=MessageRole.ASSISTANT, tool_calls=[ToolCall(id="whose-1", name="whose")])


with_deps = Agent(ScriptedModel(deps_fn), name="with_deps", tools=[whose], deps="the-deps")


def _turn(messages: list[ModelMessage]) -> list[ModelMessage]:
    """The messages of the current turn (from its user prompt on)."""
    starts = [
        i
        for i, m in enumerate(messages)
        if isinstance(m, ModelRequest) and any(isinstance(p, UserPromptPart) for p in m.parts)
    ]
    return messages[starts[-1] :]


def _parts(messages: list[ModelMessage], kind: type[Any]) -> list[Any]:
    return [
        p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, kind)
    ]


def options_fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    turn = _turn(messages)
    returned = {p.tool_name: p.content for p in _parts(turn, ToolReturnPart)}
    if "peek" not in returned:
        return ModelResponse(parts=[ToolCallPart("peek", {})])
    metadata = json.loads(str(returned["peek"]))
    settings = dict(info.model_settings or {})
    if not info.output_tools:
        seen = {"settings": settings, "metadata": metadata}
        return ModelResponse(parts=[TextPart(json.dumps(seen, sort_keys=True))])
    prompt = str(_parts(turn, UserPromptPart)[-1].content)
    # A misfit answer's retry comes back as the output tool's (failed) return.
    retried = bool(_parts(turn, RetryPromptPart)) or any(
        t.name in returned for t in info.output_tools
    )
    tenant: Any = metadata.get("tenant")
    if "always misfit" in prompt or ("misfit" in prompt and not retried):
        tenant = 42
    args = {"tenant": tenant, "temperature": settings.get("temperature")}
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, args)])


pai_options = PaiAgent(FunctionModel(options_fn), name="pai-options")


@pai_options.tool
def peek(ctx: RunContext[None]) -> str:
    """What the run's tools see as metadata."""
    return json.dumps(ctx.metadata)

"""Pydantic AI profiles for the worker tests (CONVOQ_AGENTS=tests.support.pydantic_ai_agents).

Their models are Pydantic AI's own FunctionModel and TestModel. Each model request and
each tool execution is counted in the test Redis under ``{prefix}:test:pai:{what}:{token}``
(the token is the turn's first word), with the worker's pid, so a test sees what ran
where. A prompt with ``stall-tool`` or ``stall-model`` makes the first execution of that
step hang (the test kills its worker there).
"""

from __future__ import annotations

import os
import time

from pydantic_ai import Agent, CallDeferred
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.tools import RunContext

from convoq.integrations.pydantic_ai import durable
from tests.support.worker_agents import test_key, test_redis


def count(what: str, token: str) -> int:
    """Count one execution of ``what`` for ``token``; return how many there were."""
    test_redis().rpush(test_key("pai", "pid", what, token), os.getpid())
    return int(test_redis().incr(test_key("pai", what, token)))


def _prompts(messages: list[ModelMessage]) -> list[str]:
    return [
        p.content
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart) and isinstance(p.content, str)
    ]


def _returns(messages: list[ModelMessage]) -> dict[str, str]:
    return {
        p.tool_name: p.model_response_str()
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    }


def _since_prompt(messages: list[ModelMessage]) -> list[ModelMessage]:
    starts = [i for i, m in enumerate(messages) if _prompts([m])]
    return messages[starts[-1] :]


def remember(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Answers with every prompt of the conversation so far (its memory, in order)."""
    prompts = _prompts(messages)
    count("model", prompts[-1].split()[0])
    return ModelResponse(parts=[TextPart(" | ".join(prompts))])


chat = Agent(FunctionModel(remember), name="pai-chat", instructions="Be brief.")


def steps(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Request 1 asks for ``lookup`` and ``pay``; request 2 for ``note``; request 3 answers
    with what the tools returned."""
    turn = _since_prompt(messages)
    prompt = _prompts(turn)[-1]
    token = prompt.split()[0]
    n = sum(isinstance(m, ModelResponse) for m in turn) + 1
    if count(f"model{n}", token) == 1 and n == 2 and "stall-model" in prompt:
        time.sleep(600)
    if n == 1:
        return ModelResponse(
            parts=[
                ToolCallPart("lookup", {"token": token}),
                ToolCallPart("pay", {"token": token, "amount": 5}),
            ]
        )
    if n == 2:
        return ModelResponse(parts=[ToolCallPart("note", {"token": token})])
    got = _returns(turn)
    return ModelResponse(parts=[TextPart(f"{got['lookup']} {got['pay']} {got['note']}")])


payer = Agent(FunctionModel(steps), name="pai-payer", deps_type=str)


@payer.tool_plain
def lookup(token: str) -> str:
    if count("lookup", token) == 1 and "stall" in token:
        time.sleep(600)
    return "found"


@payer.tool(requires_approval=True)
def pay(ctx: RunContext[str], token: str, amount: int) -> str:
    count("pay", token)
    return f"paid {amount} via {ctx.deps}"


@payer.tool_plain
def note(token: str) -> str:
    count("note", token)
    return "noted"


payer_profile = durable(payer, deps="the-bank")

streamer = Agent(TestModel(custom_output_text="streamed words here"), name="pai-stream")

short = durable(
    Agent(FunctionModel(remember), name="pai-short-raw"), name="pai-short", keep_last_turns=1
)
budget = durable(Agent(FunctionModel(remember)), name="pai-budget", max_history_tokens=1)


def carrier(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Calls ``ship`` (deferred to the carrier), then answers with what it returned."""
    last = messages[-1]
    if isinstance(last, ModelRequest) and not _prompts([last]):
        returned = [str(getattr(p, "content", "")) for p in last.parts]
        return ModelResponse(parts=[TextPart("carrier says: " + " ".join(returned))])
    token = _prompts(messages)[-1].split()[0]
    return ModelResponse(parts=[ToolCallPart("ship", {"token": token}, tool_call_id="ship-1")])


shipper = Agent(FunctionModel(carrier), name="pai-shipper")


@shipper.tool_plain
def ship(token: str) -> str:
    """Hand the parcel to the carrier, who answers later."""
    count("ship", token)
    raise CallDeferred(metadata={"token": token})

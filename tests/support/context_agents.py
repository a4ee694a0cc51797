"""Profiles for the RunContext tests on workers (CONVOQ_AGENTS=tests.support.context_agents).

``payer``'s tool ``pay`` takes a RunContext and records what it saw (its context, its
process, the process that made its deps) in the test Redis, under
``{CONVOQ_PREFIX}:test:pay:{conversation id}``. Its instructions greet the user named in
the turn's metadata, and its model repeats them, so a test reads them from the answer.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from convoq import Agent, Message, RunContext, ToolCall, tool
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel
from tests.support.worker_agents import test_key, test_redis


@dataclass(frozen=True)
class PayDeps:
    """What the application gives its tools: here, just which process made it."""

    made_in: int


def make_deps() -> PayDeps:
    test_redis().incr(test_key("deps_made", str(os.getpid())))
    return PayDeps(made_in=os.getpid())


def greeting(ctx: RunContext[PayDeps]) -> str:
    return f"Greet {ctx.metadata.get('user', 'nobody')}."


def over_100(ctx: RunContext[Any], arguments: dict[str, Any]) -> bool:
    return int(arguments.get("amount", 0)) > 100


@tool(requires_approval=over_100)
def pay(ctx: RunContext[PayDeps], amount: int) -> str:
    """Pay ``amount``. With ``stall`` in the metadata, its first execution of a call never
    returns (the test kills its worker there)."""
    seen = {
        "conversation_id": ctx.conversation_id,
        "turn_id": ctx.turn_id,
        "agent": ctx.agent,
        "tool_call_id": ctx.tool_call_id,
        "tool_name": ctx.tool_name,
        "attempt": ctx.attempt,
        "step": ctx.step,
        "metadata": ctx.metadata,
        "idempotency_key": ctx.idempotency_key,
        "deps_made_in": ctx.deps.made_in,
        "pid": os.getpid(),
    }
    r = test_redis()
    r.rpush(test_key("pay", str(ctx.conversation_id)), json.dumps(seen))
    if ctx.metadata.get("stall") and r.set(test_key("stalled", ctx.idempotency_key), 1, nx=True):
        time.sleep(120)
    return f"paid {amount}"


def payer_fn(request: ModelRequest) -> str | Message:
    """Calls ``pay`` with the amount the user wrote (recording which process asked), then
    repeats its system prompt and the tool result."""
    last = request.messages[-1]
    system = request.messages[0].text if request.messages[0].role == MessageRole.SYSTEM else ""
    if last.role == MessageRole.TOOL:
        return f"{system} {last.text}"
    test_redis().rpush(test_key("asked", last.text), str(os.getpid()))
    call = ToolCall(
        id=f"pay-{len(request.messages)}", name="pay", arguments={"amount": int(last.text)}
    )
    return Message(role=MessageRole.ASSISTANT, tool_calls=[call])


payer = Agent(
    ScriptedModel(payer_fn),
    greeting,
    name="payer",
    tools=[pay],
    deps_factory=make_deps,
)


async def guests_ask(ctx: RunContext[PayDeps], arguments: dict[str, Any]) -> bool:
    """The agent's policy over every tool: only an admin's turns run them unasked."""
    return ctx.metadata.get("role") != "admin"


guarded = Agent(
    ScriptedModel(payer_fn),
    greeting,
    name="guarded",
    tools=[pay],
    deps_factory=make_deps,
    approval_policy=guests_ask,
)

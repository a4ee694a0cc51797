"""Profiles for the sub-agent chaos run (CONVOQ_AGENTS=tests.support.subagent_chaos_agents).

``fanner`` asks, in one step, ``signer`` once (its ``sign`` tool needs a person's approval)
and ``doer`` twice (its ``act`` tool is slow, so kills land inside it: ``inside``
counts its runs by process), then answers with
their answers sorted. Both tools write to a separate Redis (CHAOS_EFFECTS_URL, never
killed) that plays an API deduplicating on ``ctx.idempotency_key``: every execution is
counted under ``executions:<tool>``, the effect once per key in ``effects:<tool>``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from convoq import Agent, Message, RunContext, ToolCall, tool
from convoq.models import ModelRequest, ScriptedModel

_effects: redis.Redis | None = None


def _store() -> redis.Redis:
    global _effects
    if _effects is None:
        _effects = redis.Redis.from_url(os.environ["CHAOS_EFFECTS_URL"])
    return _effects


def _effect(name: str, key: str) -> None:
    _store().rpush(f"executions:{name}", key)
    _store().sadd(f"effects:{name}", key)


@tool
def act(ctx: RunContext[None], text: str) -> str:
    """A slow side effect, applied once per idempotency key downstream; while it runs,
    ``inside`` counts it for its process (the test picks its victims by it)."""
    pid = str(os.getpid())
    _store().hincrby("inside", pid, 1)
    try:
        _effect("act", ctx.idempotency_key)
        time.sleep(0.6)
    finally:
        _store().hincrby("inside", pid, -1)
    return f"did {text}"


@tool(requires_approval=True)
def sign(ctx: RunContext[None], text: str) -> str:
    """A side effect a person approves first, applied once per idempotency key."""
    _effect("sign", ctx.idempotency_key)
    return f"signed {text}"


def _this_turn(request: ModelRequest) -> tuple[str, list[str]]:
    """The turn's user text and its tool results so far (earlier turns' are history)."""
    last = max(i for i, m in enumerate(request.messages) if m.role == "user")
    results = [m.text for m in request.messages[last:] if m.role == "tool"]
    return request.messages[last].text, results


def calling(tool_name: str) -> Any:
    """A child model: calls ``tool_name`` on its input, then answers the tool's result."""

    def model(request: ModelRequest) -> Any:
        asked, results = _this_turn(request)
        if results:
            return results[0]
        return Message.assistant("", [ToolCall(id="x", name=tool_name, arguments={"text": asked})])

    return model


def fanner_model(request: ModelRequest) -> Any:
    asked, results = _this_turn(request)
    if results:
        return " + ".join(sorted(results))
    calls = [ToolCall(id="s", name="signer", arguments={"input": f"{asked} s"}),
             ToolCall(id="d1", name="doer", arguments={"input": f"{asked} d1"}),
             ToolCall(id="d2", name="doer", arguments={"input": f"{asked} d2"})]  # fmt: skip
    return Message.assistant("", calls)


signer = Agent(ScriptedModel(calling("sign")), name="signer", tools=[sign])
doer = Agent(ScriptedModel(calling("act")), name="doer", tools=[act])
fanner = Agent(ScriptedModel(fanner_model), name="fanner", subagents=[signer, doer])

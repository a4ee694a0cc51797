"""Profiles for the scheduled-turn tests on workers (CONVOQ_AGENTS=tests.support.schedule_agents).

``stamp`` answers with its user message and records, in the test Redis under
``{CONVOQ_PREFIX}:test:ran:{conversation id}``, each turn it runs: its message and the
Redis time (ms) its run started at. ``follow_up``'s tool ``remind`` schedules a ``stamp``
turn with ``ctx.schedule``; with ``kill`` in the turn's metadata, its first run kills its
own worker (SIGKILL) right after scheduling, before the tool's result is journaled.
``follow_up_sync`` does what ``follow_up`` does from a sync tool (``ctx.schedule_sync``).
"""

from __future__ import annotations

import os
import signal
from typing import Any

from convoq import Agent, Message, RunContext, ToolCall, tool
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel
from tests.support.worker_agents import test_key, test_redis


def _user_text(request: ModelRequest) -> str:
    return next(m.text for m in reversed(request.messages) if m.role == MessageRole.USER)


def stamp_fn(request: ModelRequest) -> str:
    """Records the turn it runs (its message and the Redis time), then echoes it."""
    said = _user_text(request)
    seconds, micros = test_redis().time()
    cid = said.split("|", 1)[0]
    test_redis().rpush(test_key("ran", cid), f"{said}@{seconds * 1000 + micros // 1000}")
    return f"ran {said}"


@tool
async def remind(ctx: RunContext[Any], text: str) -> str:
    """Schedule a reminder turn a second from now."""
    turn_id = await ctx.schedule(text, delay_s=1.0, agent="stamp")
    test_redis().rpush(test_key("scheduled", str(ctx.conversation_id)), turn_id)
    if ctx.metadata.get("kill") and ctx.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return f"scheduled {turn_id}"


def follow_up_fn(request: ModelRequest) -> str | Message:
    """Calls ``remind`` once, then answers with its result."""
    last = request.messages[-1]
    if last.role == MessageRole.TOOL:
        return last.text
    call = ToolCall(id="call-remind", name="remind", arguments={"text": "reminder"})
    return Message(role=MessageRole.ASSISTANT, tool_calls=[call])


@tool
def remind_sync(ctx: RunContext[Any], text: str) -> str:
    """``remind`` as a sync tool: it schedules through the turn's loop."""
    return f"scheduled {ctx.schedule_sync(text, delay_s=1.0, agent='stamp')}"


def follow_up_sync_fn(request: ModelRequest) -> str | Message:
    """Calls ``remind_sync`` once, then answers with its result."""
    last = request.messages[-1]
    if last.role == MessageRole.TOOL:
        return last.text
    call = ToolCall(id="call-remind", name="remind_sync", arguments={"text": "sync reminder"})
    return Message(role=MessageRole.ASSISTANT, tool_calls=[call])


stamp = Agent(ScriptedModel(stamp_fn), name="stamp")
follow_up = Agent(ScriptedModel(follow_up_fn), name="follow_up", tools=[remind])
follow_up_sync = Agent(ScriptedModel(follow_up_sync_fn), name="follow_up_sync", tools=[remind_sync])


def echo_fn(request: ModelRequest) -> str:
    """Answers with its user message; no side effect (the chaos run kills Redis)."""
    return f"ran {_user_text(request)}"


echo = Agent(ScriptedModel(echo_fn), name="echo")

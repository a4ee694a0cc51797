"""Profiles for the console tests (CONVOQ_AGENTS=...,tests.support.console_agents).

``front`` hands each turn to ``desk``, which answers it. ``family`` asks its sub-agent
``helper`` once per turn (a child turn) and answers with what it said. ``taker`` asks for
its tool ``step(text)`` once per turn and then answers with the tool's result. The tool's
first run of each call kills its own worker process (after a pause, so the events before
it reach Redis): another worker takes the turn over (a ``resumed`` event, worker_lost)
and runs the call again with the same idempotency key, which the tool records under
``{CONVOQ_PREFIX}:test:step:<key>`` with the pid of each run.
"""

from __future__ import annotations

import os
import signal
import time

from convoq import Agent, Message, RunContext, ToolCall, tool
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel
from convoq.usage import Usage
from tests.support.worker_agents import test_key, test_redis

USAGE = Usage(requests=1, prompt_tokens=12, completion_tokens=3, total_tokens=15)


@tool
def step(ctx: RunContext[None], text: str) -> str:
    """A step whose first run dies with its worker."""
    runs = test_redis().rpush(test_key("step", ctx.idempotency_key), str(os.getpid()))
    if runs == 1:
        time.sleep(0.5)  # the events of the run so far go out first
        os.kill(os.getpid(), signal.SIGKILL)
    return f"stepped {text}"


def taker_fn(request: ModelRequest) -> Message:
    last = request.messages[-1]
    if last.role == MessageRole.TOOL:
        return Message.assistant(f"done: {last.text}", usage=USAGE, finish_reason="stop")
    call = ToolCall(id="step-1", name="step", arguments={"text": last.text})
    return Message.assistant("", [call], usage=USAGE, finish_reason="tool_calls")


taker = Agent(ScriptedModel(taker_fn), name="taker", tools=[step])


def _helper_fn(request: ModelRequest) -> Message:
    return Message.assistant(f"helped with {request.messages[-1].text}", usage=USAGE)


def _family_fn(request: ModelRequest) -> Message:
    last = request.messages[-1]
    if last.role == MessageRole.TOOL:
        return Message.assistant(f"the helper said: {last.text}", usage=USAGE)
    call = ToolCall(id="ask-helper", name="helper", arguments={"input": last.text})
    return Message.assistant("", [call], usage=USAGE, finish_reason="tool_calls")


helper = Agent(ScriptedModel(_helper_fn), name="helper")
# Asks its sub-agent once per turn (a child turn), then answers with what it said.
family = Agent(ScriptedModel(_family_fn), name="family", subagents=[helper])


def _front_fn(request: ModelRequest) -> Message:
    call = ToolCall(id="to-desk", name="transfer_to_desk", arguments={})
    return Message.assistant("", [call], usage=USAGE, finish_reason="tool_calls")


def _desk_fn(request: ModelRequest) -> Message:
    said = [m.text for m in request.messages if m.role == MessageRole.USER]
    return Message.assistant(f"desk here: {said[-1]}", usage=USAGE)


# ``front`` hands every turn to ``desk`` (by profile name), which answers it.
desk = Agent(ScriptedModel(_desk_fn), name="desk")
front = Agent(ScriptedModel(_front_fn), name="front", handoffs=["desk"])

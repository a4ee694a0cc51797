"""Profiles for the chaos tests: no Redis access of their own, so a Redis outage reaches
only convoq's own code paths."""

from __future__ import annotations

import os
import time

from convoq import Agent, Message, ToolCall, tool
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel


def slow_echo_fn(request: ModelRequest) -> str:
    """Takes a while (so turns are in flight when Redis dies), then echoes the user texts."""
    time.sleep(0.15)
    users = [m.text for m in request.messages if m.role == MessageRole.USER]
    return "seen: " + " | ".join(users)


slow_echo = Agent(ScriptedModel(slow_echo_fn), name="slow_echo")


def _record_path() -> str:
    return os.environ["CHAOS_TOOL_LOG"]


@tool
def record(text: str) -> str:
    """A side effect: one line per execution in the file CHAOS_TOOL_LOG names (not in
    Redis, which the chaos test kills). Lines are short and appended (O_APPEND): writers
    in several processes never interleave within a line."""
    with open(_record_path(), "a", encoding="utf-8") as log:
        log.write(f"{text}\t{os.getpid()}\n")
    return f"recorded {text}"


def effect_fn(request: ModelRequest) -> str | Message:
    """Calls ``record`` for the turn's user text, then echoes every user text seen."""
    time.sleep(0.05)
    users = [m.text for m in request.messages if m.role == MessageRole.USER]
    if request.messages[-1].role == MessageRole.TOOL:
        return "seen: " + " | ".join(users)
    call = ToolCall(
        id=f"record-{len(request.messages)}", name="record", arguments={"text": users[-1]}
    )
    return Message(role=MessageRole.ASSISTANT, tool_calls=[call])


effect = Agent(ScriptedModel(effect_fn), name="effect", tools=[record])


def nap_fn(request: ModelRequest) -> str:
    """A model call of a second, blocking its thread (as a sync SDK call would)."""
    time.sleep(1.0)
    return "rested"


napper = Agent(ScriptedModel(nap_fn), name="napper")

"""Profiles for the chaos tests: no access to convoq's Redis of their own, so a Redis
outage reaches only convoq's own code paths. ``payer``'s tool writes to a separate Redis
(CHAOS_EFFECTS_URL) that plays a payment API deduplicating on an idempotency key."""

from __future__ import annotations

import os
import time

import redis

from convoq import Agent, Message, RunContext, ToolCall, tool
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
def record(ctx: RunContext[None], text: str) -> str:
    """A side effect: one line per execution (text, process, idempotency key) in the file
    CHAOS_TOOL_LOG names (not in Redis, which the chaos test kills). Lines are short and
    appended (O_APPEND): writers in several processes never interleave within a line."""
    with open(_record_path(), "a", encoding="utf-8") as log:
        log.write(f"{text}\t{os.getpid()}\t{ctx.idempotency_key}\n")
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


def whoami_fn(request: ModelRequest) -> str:
    """Which worker process answered: a probe that the worker still serves its queue."""
    return f"served by {os.getpid()}"


whoami = Agent(ScriptedModel(whoami_fn), name="whoami")


_effects: redis.Redis | None = None


def _effects_store() -> redis.Redis:
    global _effects
    if _effects is None:
        _effects = redis.Redis.from_url(os.environ["CHAOS_EFFECTS_URL"])
    return _effects


APPLY_ONCE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  redis.call('RPUSH', KEYS[2], ARGV[2])
end
"""


@tool
def pay_once(ctx: RunContext[None], text: str) -> str:
    """A side effect through an API that dedupes on a key, as payment APIs do: every
    execution is counted; the effect is applied only for a key not seen before. Then the
    tool is slow (the call's answer takes a while), so kills land inside it: while it
    runs, ``inside`` counts it for its process, which the test picks its victims by."""
    store, pid = _effects_store(), str(os.getpid())
    store.hincrby("inside", pid, 1)
    try:
        store.rpush("executions", ctx.idempotency_key)
        # The API's dedupe and its effect are one atomic step, as a payment API's are: a
        # kill cannot land between recording the key and applying the effect.
        store.eval(
            APPLY_ONCE, 2, f"effect:{ctx.idempotency_key}", "applied", text, ctx.idempotency_key
        )
        time.sleep(0.8)
    finally:
        store.hincrby("inside", pid, -1)
    return f"paid for {text}"


def payer_fn(request: ModelRequest) -> str | Message:
    """Calls ``pay_once`` for the turn's user text, then confirms."""
    users = [m.text for m in request.messages if m.role == MessageRole.USER]
    if request.messages[-1].role == MessageRole.TOOL:
        return f"paid: {users[-1]}"
    call = ToolCall(
        id=f"pay-{len(request.messages)}", name="pay_once", arguments={"text": users[-1]}
    )
    return Message(role=MessageRole.ASSISTANT, tool_calls=[call])


payer = Agent(ScriptedModel(payer_fn), name="payer", tools=[pay_once])

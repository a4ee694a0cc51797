"""Profiles for the tests of turns run again: runs cut off from Redis, and failed turns
retried (CONVOQ_AGENTS=tests.support.rerun_agents).

``charge`` plays a payment API that dedupes on ``ctx.idempotency_key``: each execution is
listed, each effect is applied once per key. It writes to the test's Redis reached
directly (``RERUN_TEST_REDIS_URL``, else the worker's own), never through a link a test
cuts, under ``{CONVOQ_PREFIX}:test:*``, by conversation. While a conversation's ``gate``
key is set, execution n of its tool waits until the gate reaches n (the test cuts the
link first, or lets it be); the wait is bounded.
"""

from __future__ import annotations

import os
import time

import redis

from convoq import Agent, Message, RunContext, ToolCall, tool
from convoq.errors import ModelError
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel
from tests.support.redis_cluster import plain_client

_redis: redis.Redis | None = None
GATE_WAIT_S = 60.0


def test_redis() -> redis.Redis:
    global _redis
    if _redis is None:
        url = os.environ.get("RERUN_TEST_REDIS_URL") or os.environ["CONVOQ_REDIS_URL"]
        _redis = plain_client(url)
    return _redis


def rerun_key(prefix: str, *parts: str) -> str:
    """A key of these profiles' records (the test builds the same with its pool's prefix)."""
    return ":".join([prefix, "test", *parts])


def _key(*parts: str) -> str:
    return rerun_key(os.environ.get("CONVOQ_PREFIX", "convoq"), *parts)


@tool
def charge(ctx: RunContext[None], text: str) -> str:
    """Charge for ``text``, once per idempotency key."""
    r, cid = test_redis(), ctx.conversation_id
    n = r.rpush(_key("executions", cid), ctx.idempotency_key)
    r.sadd(_key("effects", cid), ctx.idempotency_key)
    deadline = time.monotonic() + GATE_WAIT_S
    while time.monotonic() < deadline:
        gate = r.get(_key("gate", cid))
        if gate is None or int(gate) >= n:
            break
        time.sleep(0.02)
    return f"charged for {text}"


def _user_text(request: ModelRequest) -> str:
    return [m.text for m in request.messages if m.role == MessageRole.USER][-1]


def _call_charge(request: ModelRequest) -> Message:
    call = ToolCall(id="charge-1", name="charge", arguments={"text": _user_text(request)})
    return Message(role=MessageRole.ASSISTANT, tool_calls=[call])


def charger_fn(request: ModelRequest) -> str | Message:
    """Calls ``charge`` for the turn's user text, then confirms."""
    if request.messages[-1].role == MessageRole.TOOL:
        return f"charged: {_user_text(request)}"
    return _call_charge(request)


def flaky_fn(request: ModelRequest) -> str | Message:
    """As ``charger``, but its answer after the tool fails while ``broken:<first word>`` is
    set (a model API that is down): the turn fails after its tool ran. Every call is
    listed under ``model_calls:<first word>``."""
    text = _user_text(request)
    word = text.split(" ", 1)[0]
    r = test_redis()
    r.rpush(_key("model_calls", word), request.messages[-1].role.value)
    if request.messages[-1].role != MessageRole.TOOL:
        return _call_charge(request)
    if r.exists(_key("broken", word)):
        raise ModelError("the model API is down")
    return f"charged: {text}"


def echo_fn(request: ModelRequest) -> str:
    users = [m.text for m in request.messages if m.role == MessageRole.USER]
    return "seen: " + " | ".join(users)


charger = Agent(ScriptedModel(charger_fn), name="charger", tools=[charge])
flaky = Agent(ScriptedModel(flaky_fn), name="flaky", tools=[charge])
echo = Agent(ScriptedModel(echo_fn), name="echo")

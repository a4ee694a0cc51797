"""Profiles for the tests of waits for the world (CONVOQ_AGENTS=tests.support.world_agents).

``courier``'s model reads the user's text ``VERB ORDER``: ``ship`` calls ``ship`` (a
deferred call: its result comes from outside), ``rush`` calls ``rush`` (deferred with a
2 s deadline), ``pay`` calls ``await_payment`` (waits for the signal ``paid``), ``both``
calls ``ship`` and ``await_payment`` in one step, ``return`` calls ``ship`` and
``refund`` (which a person approves) in one step. Each tool run is recorded under
``{CONVOQ_PREFIX}:test:runs:ORDER``; every tool result the model reads under
``{CONVOQ_PREFIX}:test:seen:ORDER``, so a test asserts what the model saw. The answer is
``done: `` and the tool results, in order.
"""

from __future__ import annotations

from convoq import Agent, CallDeferred, Message, ToolCall, WaitForSignal, tool
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel
from tests.support.worker_agents import test_key, test_redis


def _ran(name: str, order: str) -> None:
    test_redis().rpush(test_key("runs", order), name)


@tool
def ship(order: str) -> str:
    """Ship an order: the carrier answers later."""
    _ran("ship", order)
    raise CallDeferred(metadata={"order": order})


@tool
def rush(order: str) -> str:
    """Ship an order that must leave within 2 seconds."""
    _ran("rush", order)
    raise CallDeferred(timeout_s=2, metadata={"order": order})


@tool
def await_payment(order: str) -> str:
    """Wait until the order is paid."""
    _ran("await_payment", order)
    raise WaitForSignal("paid", timeout_s=120)


@tool(requires_approval=True)
def refund(order: str) -> str:
    """Refund an order (a person approves)."""
    _ran("refund", order)
    return f"refunded {order}"


CALLS = {
    "ship": ["ship"],
    "rush": ["rush"],
    "pay": ["await_payment"],
    "both": ["ship", "await_payment"],
    "return": ["ship", "refund"],
}


def courier_fn(request: ModelRequest) -> Message:
    start = max(i for i, m in enumerate(request.messages) if m.role == MessageRole.USER)
    verb, order = request.messages[start].text.split(" ", 1)
    last = request.messages[-1]
    if last.role == MessageRole.TOOL:
        results = [m for m in request.messages[start:] if m.role == MessageRole.TOOL]
        for m in results:
            test_redis().rpush(test_key("seen", order), m.text)
        return Message.assistant("done: " + " | ".join(m.text for m in results))
    calls = [
        ToolCall(id=f"{name}-{order}", name=name, arguments={"order": order})
        for name in CALLS[verb]
    ]
    return Message.assistant("", calls)


courier = Agent(
    ScriptedModel(courier_fn), name="courier", tools=[ship, rush, await_payment, refund]
)

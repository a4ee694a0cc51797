"""Waits for the world in process: an Agent whose tool raises CallDeferred or
WaitForSignal returns a ``waiting`` Response with the parked continuation; ``resume``
with the call's result goes on once, and the model reads that result; the conversation
stays reserved meanwhile; a continuation past its call's deadline is refused. Over every
memory backend (the Redis one holds the workers' lease)."""

from __future__ import annotations

import time

import pytest

from convoq import Agent, CallDeferred, ConvoqError, Message, ToolCall, WaitForSignal, tool
from convoq.errors import ConversationBusyError
from convoq.memory import ConversationMemory
from convoq.messages import Decision, MessageRole
from convoq.models import ModelRequest, ScriptedModel

SEEN: list[str] = []


@tool
def ship(order: str) -> str:
    """Ship an order: the carrier answers later."""
    raise CallDeferred(timeout_s=60, metadata={"order": order})


@tool
def await_payment(order: str) -> str:
    """Wait until the order is paid."""
    raise WaitForSignal("paid")


@tool(requires_approval=True)
def refund(order: str) -> str:
    """Refund an order (a person approves)."""
    return f"refunded {order}"


def _model(*names: str) -> ScriptedModel:
    def answer(request: ModelRequest) -> Message:
        last = request.messages[-1]
        if last.role == MessageRole.TOOL:
            texts = [m.text for m in request.messages if m.role == MessageRole.TOOL]
            SEEN[:] = texts
            return Message.assistant("done: " + " | ".join(texts))
        calls = [ToolCall(id=f"{n}-1", name=n, arguments={"order": "A7"}) for n in names]
        return Message.assistant("", calls)

    return ScriptedModel(answer)


def test_a_deferred_call_waits_and_resumes_with_its_result(memory: ConversationMemory) -> None:
    agent = Agent(_model("ship"), memory=memory, conversation_id="c", tools=[ship])
    parked = agent.generate("ship A7")
    assert parked.status == "waiting" and parked.pending_approvals == []
    assert parked.waiting_for == [{
        "call_id": "ship-1", "name": "ship", "on": "result", "signal": None, "timeout_s": 60.0,
        "metadata": {"order": "A7"},
    }]  # fmt: skip
    saved = parked.continuation.model_dump_json()  # type: ignore[union-attr]
    with pytest.raises(ConversationBusyError):
        agent.generate("anything new?")
    done = agent.resume(saved, {"ship-1": {"tracking": "T1"}})
    assert done.text == 'done: {"tracking":"T1"}' and SEEN == ['{"tracking":"T1"}']
    assert len(memory.load("c")) == 4  # stored once
    with pytest.raises(ConvoqError):
        agent.resume(saved, {"ship-1": {"tracking": "T1"}})  # a continuation runs once


def test_a_signal_wait_and_an_approval_in_one_step(memory: ConversationMemory) -> None:
    agent = Agent(_model("await_payment", "refund"), memory=memory, conversation_id="c",
                  tools=[await_payment, refund])  # fmt: skip
    parked = agent.generate("refund A7 once paid")
    assert parked.status == "awaiting_approval"  # a person decides the refund
    assert [c.id for c in parked.pending_approvals] == ["refund-1"]
    assert [(w["call_id"], w["signal"]) for w in parked.waiting_for] == [
        ("await_payment-1", "paid")
    ]
    error = Decision(approved=True, result="card declined", is_error=True)
    done = agent.resume(parked.continuation, {"await_payment-1": error, "refund-1": True})  # type: ignore[arg-type]
    assert done.text == "done: card declined | refunded A7"


def test_a_continuation_past_its_call_deadline_is_refused(memory: ConversationMemory) -> None:
    @tool
    def quick(order: str) -> str:
        """Answered within half a second, or never."""
        raise CallDeferred(timeout_s=0.5)

    agent = Agent(_model("quick"), memory=memory, conversation_id="c", tools=[quick])
    parked = agent.generate("quick A7")
    cont = parked.continuation
    assert cont is not None and cont.expires_ms is not None
    while time.time() * 1000 < cont.expires_ms + 10:  # bounded: half a second
        time.sleep(0.05)
    with pytest.raises(ConvoqError, match="expired"):
        agent.resume(cont, {"quick-1": "late"})

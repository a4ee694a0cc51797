"""Tools that need approval pause the turn; resume completes it once, discard drops it."""

from __future__ import annotations

import json

import pytest

from convoq import Agent, Continuation, Decision, Message, ToolCall, tool
from convoq.errors import ConversationBusyError, ConvoqError
from convoq.memory import InMemoryConversationMemory
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel

ran: list[str] = []


@tool(requires_approval=True)
def transfer(amount: int, to: str) -> str:
    """Move money."""
    ran.append(f"{amount}->{to}")
    return f"sent {amount} to {to}"


@tool
def balance() -> int:
    """Current balance."""
    return 100


def banker(request: ModelRequest) -> str | Message:
    last = request.messages[-1]
    if last.role == MessageRole.USER:
        return Message(role="assistant", tool_calls=[
            ToolCall(id="b1", name="balance"),
            ToolCall(id="t1", name="transfer", arguments={"amount": 5, "to": "bob"}),
        ])  # fmt: skip
    results = [m.text for m in request.messages if m.role == MessageRole.TOOL]
    return "; ".join(results)


@pytest.fixture
def setup() -> tuple[Agent, InMemoryConversationMemory]:
    ran.clear()
    memory = InMemoryConversationMemory()
    agent = Agent(ScriptedModel(banker), memory=memory, conversation_id="bank",
                  tools=[transfer, balance])  # fmt: skip
    return agent, memory


def test_pause_stores_nothing_and_keeps_the_conversation_reserved(setup) -> None:  # type: ignore[no-untyped-def]
    agent, memory = setup
    r = agent.generate("pay bob")
    assert r.status == "awaiting_approval" and r.text == ""
    assert [c.id for c in r.pending_approvals] == ["t1"]
    assert ran == [] and memory.load("bank") == []
    with pytest.raises(ConversationBusyError):
        agent.generate("another turn")


def test_approve_runs_the_call_and_stores_the_turn_once(setup) -> None:  # type: ignore[no-untyped-def]
    agent, memory = setup
    r = agent.generate("pay bob")
    wire = json.loads(r.continuation.model_dump_json())  # type: ignore[union-attr]
    done = agent.resume(wire, {"t1": True})
    assert done.status == "completed" and done.text == "100; sent 5 to bob"
    assert ran == ["5->bob"]
    stored = memory.load("bank")
    assert [m.role.value for m in stored] == ["user", "assistant", "tool", "tool", "assistant"]
    with pytest.raises(ConvoqError, match="already resumed"):
        agent.resume(wire, {"t1": True})
    assert len(memory.load("bank")) == 5
    assert agent.generate("next").status == "awaiting_approval"


def test_deny_tells_the_model(setup) -> None:  # type: ignore[no-untyped-def]
    agent, memory = setup
    r = agent.generate("pay bob")
    done = agent.resume(r.continuation, {"t1": Decision(approved=False, reason="too much")})  # type: ignore[arg-type]
    assert ran == []
    assert "denied" in done.text and "too much" in done.text
    assert len(memory.load("bank")) == 5


def test_discard_frees_the_conversation_and_stores_nothing(setup) -> None:  # type: ignore[no-untyped-def]
    agent, memory = setup
    r = agent.generate("pay bob")
    assert r.continuation is not None
    agent.discard(r.continuation)
    assert memory.load("bank") == []
    with pytest.raises(ConvoqError, match="already resumed or discarded"):
        agent.resume(r.continuation, {"t1": True})
    agent.model = ScriptedModel(lambda req: "free again")
    assert agent.generate("hello").text == "free again"


def test_continuation_round_trips_as_json(setup) -> None:  # type: ignore[no-untyped-def]
    agent, _ = setup
    r = agent.generate("pay bob")
    text = r.continuation.model_dump_json()  # type: ignore[union-attr]
    assert Continuation.model_validate_json(text) == r.continuation
    done = agent.resume(text, {"t1": True})
    assert done.status == "completed"


def test_unknown_call_id_in_decisions_is_refused(setup) -> None:  # type: ignore[no-untyped-def]
    agent, _ = setup
    r = agent.generate("pay bob")
    with pytest.raises(ConvoqError, match="no pending tool call"):
        agent.resume(r.continuation, {"nope": True})  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["not json", "{}", {"token": "t"}])
def test_a_malformed_continuation_is_a_convoq_error(setup, bad) -> None:  # type: ignore[no-untyped-def]
    agent, memory = setup
    with pytest.raises(ConvoqError, match="not a continuation"):
        agent.resume(bad, {"t1": True})
    assert memory.load("bank") == []

"""Handoffs in process: the turn goes on as the agent it was handed to, in this process,
on the same engine; the conversation's next turns follow it; limits, refusals,
approvals and guardrails around a turn that handed off."""

from __future__ import annotations

from typing import Any

import pytest

from convoq import Agent, GuardrailResult, Message, RunContext, ToolCall, tool
from convoq.errors import ConfigurationError, GuardrailTripped
from convoq.handoffs import HandoffTool, handoff_tool
from convoq.memory import InMemoryConversationMemory
from convoq.models import ModelRequest, ScriptedModel
from convoq.models._openai_wire import wire_message
from convoq.tools import ToolRegistry


def _to(target: str, call_id: str = "h") -> Message:
    return Message.assistant("", [ToolCall(id=call_id, name=f"transfer_to_{target}", arguments={})])


def _router(target: str) -> ScriptedModel:
    """Hands off at once; answers when the turn comes back to it."""

    def answer(request: ModelRequest) -> object:
        if request.messages[-1].role == "user":
            return _to(target)
        return f"router got it back: {request.messages[-1].text}"

    return ScriptedModel(answer)


def _echo(name: str) -> ScriptedModel:
    def answer(request: ModelRequest) -> str:
        users = [m.text for m in request.messages if m.role == "user"]
        system = next(m.text for m in request.messages if m.role == "system")
        return f"{name} ({system}): {users[-1]}"

    return ScriptedModel(answer)


def test_the_rest_of_the_turn_runs_as_the_agent_handed_to() -> None:
    billing = Agent(_echo("billing"), "billing rules", name="billing")
    triage = Agent(_router("billing"), "triage rules", name="triage", handoffs=[billing])
    r = triage.generate("refund")
    assert r.text == "billing (billing rules): refund" and r.agent == "billing"
    assert [(m.role.value, m.name, m.text) for m in r.turn] == [
        ("user", None, "refund"),
        ("assistant", "triage", ""),
        ("tool", "transfer_to_billing", '{"assistant": "billing"}'),
        ("assistant", "billing", "billing (billing rules): refund"),
    ]
    assert r.usage.requests == 2
    # Chat Completions sends who answered as the assistant message's name.
    assert wire_message(r.turn[1])["name"] == "triage"


def test_the_model_sees_one_transfer_tool_per_target() -> None:
    seen: list[Any] = []

    def model(request: ModelRequest) -> str:
        seen.extend(request.tools)
        return "ok"

    a = Agent(_echo("a"), name="a")
    b = Agent(_echo("b"), name="b")
    Agent(ScriptedModel(model), name="x", handoffs=[a, handoff_tool(b, description="B!")]).generate(
        "hi"
    )
    assert [(s.name, s.description) for s in seen] == [
        ("transfer_to_a", "Handoff to the a agent to handle the request."),
        ("transfer_to_b", "B!"),
    ]
    assert all(not s.parameters.get("properties") for s in seen)


def test_a_stream_shows_the_handoff() -> None:
    billing = Agent(_echo("billing"), "b", name="billing")
    triage = Agent(_router("billing"), name="triage", handoffs=[billing])
    events = list(triage.stream("refund"))
    assert [e.data for e in events if e.type == "handoff"] == [
        {"call_id": "h", "from": "triage", "to": "billing"}
    ]


def test_the_next_turns_follow_the_handoff_until_a_third_agent_or_a_hand_back() -> None:
    memory = InMemoryConversationMemory()

    def billing_model(request: ModelRequest) -> object:
        text = request.messages[-1].text
        if request.messages[-1].role == "user" and "back" in text:
            return _to("triage", "b")
        return f"billing: {text}"

    billing = Agent(ScriptedModel(billing_model), name="billing")
    triage = Agent(_router("billing"), name="triage", handoffs=[billing], memory=memory)
    billing.tools = ToolRegistry([handoff_tool(triage)])  # and back (a cycle)
    other = Agent(_echo("other"), "o", name="other", memory=memory)
    assert triage.generate("one", conversation_id="c").agent == "billing"
    assert triage.generate("two", conversation_id="c").text == "billing: two"  # followed
    assert other.generate("three", conversation_id="c").agent == "other"  # a third agent
    assert triage.generate("four", conversation_id="c").agent == "billing"  # triage again
    back = triage.generate("go back", conversation_id="c")  # billing hands back
    assert back.agent == "triage" and back.text.startswith("router got it back")
    five = triage.generate("five", conversation_id="c")  # triage's own turn again
    assert [m.name for m in five.turn if m.role == "assistant"] == ["triage", "billing"]


def test_a_handoff_loop_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVOQ_MAX_HANDOFFS", "3")

    def looping(other: str) -> ScriptedModel:
        def answer(request: ModelRequest) -> object:
            last = request.messages[-1]
            if last.role == "tool" and last.text.startswith("Error"):
                return f"stopped: {last.text}"
            return _to(other, f"h{len(request.messages)}")

        return ScriptedModel(answer)

    a = Agent(looping("b"), name="a", max_steps=20)
    b = Agent(looping("a"), name="b", max_steps=20, handoffs=[a])
    a.tools = ToolRegistry([handoff_tool(b)])
    r = a.generate("go")
    assert r.text.startswith("stopped: Error: this turn handed off 3 times, the most allowed")
    assert "CONVOQ_MAX_HANDOFFS" in r.text
    # Three handoffs followed; the fourth asked (by b) refused, and b answers.
    assert [m.name for m in r.turn if m.role == "assistant"] == ["a", "b", "a", "b", "b"]


def test_only_the_first_handoff_of_a_step_is_followed() -> None:
    def model(request: ModelRequest) -> object:
        return Message.assistant("", [
            ToolCall(id="1", name="transfer_to_b", arguments={}),
            ToolCall(id="2", name="transfer_to_c", arguments={}),
        ])  # fmt: skip

    b, c = Agent(_echo("b"), "b", name="b"), Agent(_echo("c"), "c", name="c")
    r = Agent(ScriptedModel(model), name="a", handoffs=[b, c]).generate("x")
    assert r.agent == "b"
    results = {m.tool_call_id: m.text for m in r.turn if m.role == "tool"}
    assert results == {"1": '{"assistant": "b"}', "2": results["2"]}
    assert results["2"].startswith("Error: only the first handoff of a step is followed")


def test_a_step_that_hands_off_runs_its_other_calls_first_even_across_an_approval() -> None:
    ran: list[str] = []

    @tool(requires_approval=True)
    def refund(amount: int) -> str:
        """Refunds."""
        ran.append(f"refund {amount}")
        return "refunded"

    def model(request: ModelRequest) -> object:
        return Message.assistant("", [
            ToolCall(id="h", name="transfer_to_billing", arguments={}),
            ToolCall(id="r", name="refund", arguments={"amount": 5}),
        ])  # fmt: skip

    billing = Agent(_echo("billing"), "b", name="billing")
    triage = Agent(ScriptedModel(model), name="triage", tools=[refund], handoffs=[billing])
    paused = triage.generate("refund 5")
    assert paused.status == "awaiting_approval" and [c.id for c in paused.pending_approvals] == [
        "r"
    ]
    done = triage.resume(paused.continuation, {"r": True})
    assert ran == ["refund 5"] and done.agent == "billing"
    assert done.text == "billing (b): refund 5"


def test_guardrails_around_a_turn_that_handed_off() -> None:
    checked: list[str] = []

    def input_check(name: str) -> Any:
        def check(ctx: RunContext[Any], message: Message) -> GuardrailResult:
            checked.append(f"input {name}")
            return GuardrailResult()

        return check

    def output_check(name: str) -> Any:
        def check(ctx: RunContext[Any], answer: Any) -> GuardrailResult:
            checked.append(f"output {name}")
            return GuardrailResult(tripped="forbidden" in answer, reason=f"{name} says no")

        return check

    billing = Agent(
        _echo("billing"), "b", name="billing",
        input_guardrails=[input_check("billing")], output_guardrails=[output_check("billing")],
    )  # fmt: skip
    triage = Agent(
        _router("billing"), name="triage", handoffs=[billing],
        input_guardrails=[input_check("triage")], output_guardrails=[output_check("triage")],
    )  # fmt: skip
    triage.generate("fine")
    assert checked == ["input triage", "output billing"]
    with pytest.raises(GuardrailTripped, match="billing says no"):
        triage.generate("forbidden")


def test_handoffs_that_cannot_work_are_refused() -> None:
    target = Agent(_echo("t"), name="t")
    with pytest.raises(ConfigurationError, match="handoffs") as unnamed:
        Agent(_echo("x"), handoffs=[target])
    assert unnamed.value.details["option"] == "handoffs"
    with pytest.raises(ConfigurationError, match="letters, digits"):
        Agent(_echo("x"), name="x", handoffs=[Agent(_echo("t"), name="a b")])
    with pytest.raises(ConfigurationError, match="handoffs takes agents"):
        Agent(_echo("x"), name="x", handoffs=[42])
    by_name = Agent(_echo("x"), name="x", handoffs=["billing"])
    assert isinstance(by_name.tools.get("transfer_to_billing"), HandoffTool)
    with pytest.raises(ConfigurationError, match="worker profile name") as refused:
        by_name.generate("hi")
    assert refused.value.details == {"option": "handoffs", "profile": "billing"}


def test_a_pydantic_ai_profile_refuses_handoffs() -> None:
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.models.test import TestModel

    from convoq.integrations.pydantic_ai import durable

    with pytest.raises(ConfigurationError, match="Pydantic AI has no handoff") as refused:
        durable(PydanticAgent(TestModel(), name="pai"), handoffs=["billing"])
    assert refused.value.details["option"] == "handoffs"


def test_a_worker_refuses_a_handoff_to_a_pydantic_ai_profile() -> None:
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.models.test import TestModel

    from convoq.integrations.pydantic_ai import durable
    from convoq.worker.profiles import Profiles

    helper = durable(PydanticAgent(TestModel(), name="helper"))
    front = Agent(_echo("front"), name="front", handoffs=["helper"])
    with pytest.raises(ConfigurationError, match="only a convoq Agent profile") as refused:
        Profiles([front, helper])
    assert refused.value.details == {"option": "handoffs", "profile": "helper"}
    # A target given as an agent is served too; one named only may be another pool's.
    billing = Agent(_echo("billing"), name="billing")
    served = Profiles([Agent(_echo("t"), name="t", handoffs=[billing, "elsewhere"])])
    assert sorted(served) == ["billing", "t"]


def test_a_pool_has_queues_of_its_own() -> None:
    from convoq.queue import routing
    from convoq.settings import ConvoqSettings

    n = routing.partition_of("c1", 4)
    assert routing.route("c1", prefix="p", partitions=4, pool="billing") == f"p.billing.p{n}"
    assert routing.route("c1", prefix="p", partitions=4) == f"p.p{n}"
    pools = ConvoqSettings.resolve(agent_pools={"billing": "billing"}, pool="billing")
    assert (pools.agent_pools, pools.pool) == ({"billing": "billing"}, "billing")
    with pytest.raises(ConfigurationError, match="CONVOQ_POOL"):
        ConvoqSettings.resolve(pool="a.b")  # a pool's name is part of its queues' names


def test_a_named_message_of_the_input_is_no_handoff() -> None:
    from convoq.messages import GenerationRequest

    @tool
    def echo(text: str) -> str:
        """Echoes."""
        return text

    asked = Message.assistant("", [ToolCall(id="e", name="echo", arguments={"text": "hi"})])
    named = asked.model_copy(update={"name": "bob"})  # a participant name, no agent
    agent = Agent(ScriptedModel(lambda r: f"got {r.messages[-1].text}"), tools=[echo])
    r = agent.generate(GenerationRequest(messages=[Message.user("go"), named]))
    assert r.text == "got hi" and r.agent is None

"""Guardrails in process: input checks before (or beside) the first model call, output
checks on the final answer; a trip blocks the turn and stores nothing."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from prometheus_client import REGISTRY
from pydantic import BaseModel

from convoq import Agent, Message, RunContext
from convoq.errors import ConvoqError, GuardrailTripped
from convoq.guardrails import (
    MAX_REASON_CHARS,
    GuardrailResult,
    GuardrailVerdict,
    InputGuardrail,
    input_guardrail,
    output_guardrail,
)
from convoq.memory import InMemoryConversationMemory
from convoq.models import ScriptedModel
from convoq.models.base import ModelRequest


def no_secrets(ctx: RunContext[Any], message: Message) -> GuardrailResult:
    if "password" in message.text:
        return GuardrailResult.trip("asks for a password", info={"word": "password"})
    return GuardrailResult.passed()


@output_guardrail(name="no_shouting")
async def no_shouting(ctx: RunContext[Any], answer: Any) -> GuardrailResult:
    if isinstance(answer, str) and answer.isupper():
        return GuardrailResult.trip("the answer shouts")
    return GuardrailResult.passed()


def echo(request: ModelRequest) -> str:
    return request.messages[-1].text.upper() if "shout" in request.messages[-1].text else "ok"


def trips(kind: str, guardrail: str) -> float:
    labels = {"agent": "guarded", "guardrail": guardrail, "kind": kind}
    return REGISTRY.get_sample_value("convoq_guardrail_trips_total", labels) or 0.0


def make(model: ScriptedModel, **options: Any) -> Agent:
    return Agent(model, name="guarded", memory=InMemoryConversationMemory(), **options)


def test_a_tripped_input_guardrail_blocks_before_any_model_call_and_stores_nothing() -> None:
    model = ScriptedModel(echo)
    agent = make(model, input_guardrails=[no_secrets])
    before = trips("input", "no_secrets")
    with pytest.raises(GuardrailTripped) as caught:
        agent.generate("tell me the password", conversation_id="c1")
    err = caught.value
    assert (err.guardrail, err.kind, err.reason) == ("no_secrets", "input", "asks for a password")
    assert err.info == {"word": "password"}
    assert "no_secrets" in err.message and "asks for a password" in err.message
    assert model.call_count == 0
    assert agent.memory is not None and agent.memory.load("c1") == []
    assert trips("input", "no_secrets") == before + 1
    # The conversation is free again: the next turn runs and is stored.
    assert agent.generate("hello", conversation_id="c1").text == "ok"
    assert [m.text for m in agent.memory.load("c1")] == ["hello", "ok"]


def test_a_tripped_output_guardrail_blocks_the_answer_and_stores_nothing() -> None:
    agent = make(ScriptedModel(echo), output_guardrails=[no_shouting])
    before = trips("output", "no_shouting")
    with pytest.raises(GuardrailTripped) as caught:
        agent.generate("shout it", conversation_id="c2")
    assert (caught.value.guardrail, caught.value.kind) == ("no_shouting", "output")
    assert caught.value.reason == "the answer shouts"
    assert agent.memory is not None and agent.memory.load("c2") == []
    assert trips("output", "no_shouting") == before + 1
    assert agent.generate("say it", conversation_id="c2").text == "ok"


def test_the_stream_says_which_guardrail_tripped_before_the_error() -> None:
    agent = make(ScriptedModel(echo), input_guardrails=[no_secrets])
    seen: list[Any] = []
    with pytest.raises(GuardrailTripped):
        for event in agent.stream("my password?", conversation_id="c3"):
            seen.append(event)
    tripped = [e for e in seen if e.type == "guardrail_tripped"]
    assert [e.data for e in tripped] == [
        {"guardrail": "no_secrets", "kind": "input", "reason": "asks for a password",
         "info": {"word": "password"}}
    ]  # fmt: skip
    assert not any(e.type == "assistant" for e in seen)


class Answer(BaseModel):
    n: int


def test_output_guardrails_see_the_typed_output() -> None:
    seen: list[Any] = []

    def small(ctx: RunContext[Any], answer: Any) -> GuardrailResult:
        seen.append(answer)
        return GuardrailResult.trip("too big") if answer.n > 10 else GuardrailResult.passed()

    agent = make(ScriptedModel(lambda r: {"n": 42}), output_type=Answer, output_guardrails=[small])
    with pytest.raises(GuardrailTripped, match="too big"):
        agent.generate("n?", conversation_id="c4")
    assert seen == [Answer(n=42)]


def test_guardrails_see_the_run_context() -> None:
    seen: list[RunContext[Any]] = []

    def look(ctx: RunContext[Any], value: Any) -> GuardrailResult:
        seen.append(ctx)
        return GuardrailResult.passed()

    agent = make(ScriptedModel(echo), input_guardrails=[look], output_guardrails=[look],
                 deps={"db": 1})  # fmt: skip
    agent.generate("hi", conversation_id="c5", metadata={"user": "u1"})
    assert [(c.conversation_id, c.agent, c.deps, c.metadata) for c in seen] == [
        ("c5", "guarded", {"db": 1}, {"user": "u1"})
    ] * 2
    assert seen[0].step == 0 and seen[1].step == 1


def test_a_guardrail_that_raises_fails_the_turn_with_its_error() -> None:
    def broken(ctx: RunContext[Any], message: Message) -> GuardrailResult:
        raise RuntimeError("checker down")

    agent = make(ScriptedModel(echo), input_guardrails=[broken])
    with pytest.raises(RuntimeError, match="checker down"):
        agent.generate("hi", conversation_id="c6")
    assert agent.memory is not None and agent.memory.load("c6") == []


def test_a_guardrail_answering_no_result_fails_the_turn_saying_so() -> None:
    agent = make(ScriptedModel(echo), output_guardrails=[lambda ctx, v: True])
    with pytest.raises(ConvoqError, match="returned bool, not a GuardrailResult"):
        agent.generate("hi", conversation_id="c7")


def test_a_parallel_input_guardrail_discards_the_model_answer_when_it_trips() -> None:
    answered = threading.Event()

    def model(request: ModelRequest) -> str:
        answered.set()
        return "the secret is 42"

    @input_guardrail(name="slow_check", run_in_parallel=True)
    async def slow_check(ctx: RunContext[Any], message: Message) -> GuardrailResult:
        # Trips only after the model answered: the answer existed, and is dropped.
        await asyncio.to_thread(answered.wait, 10)
        return GuardrailResult.trip("off topic")

    agent = make(ScriptedModel(model), input_guardrails=[slow_check])
    seen: list[Any] = []
    with pytest.raises(GuardrailTripped, match="off topic"):
        for event in agent.stream("hi", conversation_id="c8"):
            seen.append(event)
    assert answered.is_set()
    assert not any(e.type == "assistant" for e in seen)
    assert agent.memory is not None and agent.memory.load("c8") == []


def test_a_parallel_input_guardrail_that_passes_keeps_the_answer() -> None:
    beside = InputGuardrail(lambda ctx, m: GuardrailResult.passed(), "fine", run_in_parallel=True)
    agent = make(ScriptedModel(echo), input_guardrails=[beside])
    assert agent.generate("hi", conversation_id="c9").text == "ok"


def test_an_agent_is_a_guardrail_asked_for_a_verdict() -> None:
    asked: list[ModelRequest] = []

    def judge(request: ModelRequest) -> GuardrailVerdict:
        asked.append(request)
        return GuardrailVerdict(tripped="refund" in request.messages[-1].text, reason="refunds")

    checker = Agent(ScriptedModel(judge), name="policy_checker")
    agent = make(ScriptedModel(echo), input_guardrails=[checker])
    with pytest.raises(GuardrailTripped) as caught:
        agent.generate("I want a refund", conversation_id="c10")
    assert (caught.value.guardrail, caught.value.reason) == ("policy_checker", "refunds")
    assert asked[0].output is not None and asked[0].output.name == "GuardrailVerdict"
    assert agent.generate("hello", conversation_id="c10").text == "ok"


def test_long_reasons_are_cut_and_large_info_is_replaced() -> None:
    def wordy(ctx: RunContext[Any], message: Message) -> GuardrailResult:
        return GuardrailResult.trip("x" * 5000, info="y" * 20000)

    agent = make(ScriptedModel(echo), input_guardrails=[wordy])
    with pytest.raises(GuardrailTripped) as caught:
        agent.generate("hi", conversation_id="c11")
    assert caught.value.reason == "x" * MAX_REASON_CHARS + "..."
    assert "omitted" in caught.value.info


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"input_guardrails": ["nope"]}, "an input guardrail is a function"),
        ({"input_guardrails": no_secrets}, "input_guardrails must be a list"),
        ({"input_guardrails": [no_shouting]}, "is an output guardrail"),
        ({"output_guardrails": [no_secrets, no_secrets]}, "share a name"),
        (
            {"input_guardrails": [Agent(ScriptedModel(echo), memory=InMemoryConversationMemory())]},
            "runs without memory",
        ),
    ],
)
def test_bad_guardrail_options_are_refused_when_the_agent_is_made(
    options: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConvoqError, match=match):
        Agent(ScriptedModel(echo), **options)


def test_a_rerun_that_finds_the_first_answer_journaled_does_not_check_the_input_again() -> None:
    from convoq.engine import Completed, TurnLoop
    from convoq.tools import ToolRegistry
    from convoq.turn_state import TurnState

    checked: list[str] = []

    def count(ctx: RunContext[Any], message: Message) -> GuardrailResult:
        checked.append(message.text)
        return GuardrailResult.passed()

    guard = (InputGuardrail(count, "count"),)
    model = ScriptedModel(echo)
    loop = TurnLoop(model=model, tools=ToolRegistry([]), history=[], input_guardrails=guard)
    fresh = TurnState.start(Message.user("hi"))
    assert isinstance(asyncio.run(loop.run(fresh)), Completed)
    assert checked == ["hi"]
    # The state a journal keeps after the first model call: the guardrails passed then.
    journaled = TurnState(messages=[Message.user("hi"), Message.assistant("ok")], steps=1)
    assert isinstance(asyncio.run(loop.run(journaled)), Completed)
    assert checked == ["hi"] and model.call_count == 1


def test_around_an_approval_input_is_checked_once_and_output_on_the_final_answer() -> None:
    from convoq import ToolCall, tool

    @tool(requires_approval=True)
    def refund(amount: int) -> str:
        """Refund an amount."""
        return f"refunded {amount}"

    def model(request: ModelRequest) -> Any:
        if request.messages[-1].role == "tool":
            return "done: " + request.messages[-1].text
        return Message.assistant("", [ToolCall(id="r1", name="refund", arguments={"amount": 5})])

    checked: list[tuple[str, Any]] = []

    def log_input(ctx: RunContext[Any], message: Message) -> GuardrailResult:
        checked.append(("input", message.text))
        return GuardrailResult.passed()

    def log_output(ctx: RunContext[Any], answer: Any) -> GuardrailResult:
        checked.append(("output", answer))
        return GuardrailResult.passed()

    agent = make(ScriptedModel(model), tools=[refund], input_guardrails=[log_input],
                 output_guardrails=[log_output])  # fmt: skip
    parked = agent.generate("refund me", conversation_id="c12")
    assert parked.status == "awaiting_approval" and checked == [("input", "refund me")]
    assert parked.continuation is not None
    done = agent.resume(parked.continuation, {"r1": True})
    assert done.text == "done: refunded 5"
    assert checked == [("input", "refund me"), ("output", "done: refunded 5")]


def test_a_turn_ended_by_an_expired_approval_has_no_answer_to_check() -> None:
    from convoq import ToolCall
    from convoq.engine import Expired, TurnLoop
    from convoq.tools import ToolRegistry
    from convoq.turn_state import TurnState

    called: list[Any] = []
    guard = output_guardrail(name="never")(lambda ctx, v: called.append(v))
    call = ToolCall(id="r1", name="refund", arguments={})
    state = TurnState(
        messages=[Message.user("hi"), Message.assistant("", [call]),
                  Message.tool_result(call, "the approval expired")],
        steps=1, expired=True,
    )  # fmt: skip
    loop = TurnLoop(model=ScriptedModel(echo), tools=ToolRegistry([]), history=[],
                    output_guardrails=(guard,))  # fmt: skip
    assert isinstance(asyncio.run(loop.run(state)), Expired)
    assert called == []

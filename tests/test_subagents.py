"""Sub-agents in process: an agent's sub-agent calls run the sub-agents' own turns (the
calls of one step together), each answer the call's tool result; failures are tool
errors; depth and fan-out are bounded; profile names are refused in process."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from convoq import Agent, GuardrailResult, Message, RunContext, ToolCall
from convoq.errors import ConfigurationError
from convoq.memory import InMemoryConversationMemory
from convoq.models import ModelRequest, ScriptedModel
from convoq.subagents import child_ids
from convoq.tools import ToolRegistry


def fan_out(*names: str) -> Any:
    """A parent model: calls each sub-agent once, then answers with their results."""

    def model(request: ModelRequest) -> Any:
        results = [m.text for m in request.messages if m.role == "tool"]
        if results:
            return " | ".join(results)
        calls = [ToolCall(id=f"c{i}", name=n, arguments={"input": f"{n}?"})
                 for i, n in enumerate(names)]  # fmt: skip
        return Message.assistant("", calls)

    return model


def test_the_calls_of_one_step_run_together_and_their_answers_are_the_results() -> None:
    spans: list[tuple[float, float]] = []
    lock = threading.Lock()

    def slow(name: str) -> Agent:
        def answer(request: ModelRequest) -> str:
            start = time.monotonic()
            time.sleep(0.3)
            with lock:
                spans.append((start, time.monotonic()))
            return f"{name} says {request.messages[-1].text}"

        return Agent(ScriptedModel(answer), name=name)

    parent = Agent(
        ScriptedModel(fan_out("a", "b", "c")), subagents=[slow("a"), slow("b"), slow("c")]
    )
    r = parent.generate("go")
    assert r.text == "a says a? | b says b? | c says c?"
    assert max(s for s, _ in spans) < min(e for _, e in spans)  # they overlapped
    assert [m.role for m in r.turn] == ["user", "assistant", "tool", "tool", "tool", "assistant"]


def test_a_sub_agent_with_memory_stores_the_call_on_its_child_conversation() -> None:
    seen: dict[str, RunContext[Any]] = {}

    def remember(key: str) -> Any:
        def instructions(ctx: RunContext[Any]) -> str:
            seen[key] = ctx
            return "Be brief."

        return instructions

    memory = InMemoryConversationMemory()
    helper = Agent(ScriptedModel(lambda r: "helped"), remember("child"), name="helper",
                   memory=memory)  # fmt: skip
    tool = helper.as_tool(name="ask_helper", description="Asks the helper.")
    parent = Agent(ScriptedModel(fan_out("ask_helper")), remember("parent"),
                   memory=InMemoryConversationMemory(), subagents=[tool])  # fmt: skip
    assert parent.generate("go", conversation_id="p1").text == "helped"
    expected = child_ids("p1", seen["parent"].turn_id, "c0")
    assert seen["child"].conversation_id == expected.conversation_id
    assert [m.text for m in memory.load(expected.conversation_id)] == ["ask_helper?", "helped"]
    spec = next(s for s in parent.tools.specs() if s.name == "ask_helper")
    assert spec.description == "Asks the helper." and list(spec.parameters["properties"]) == [
        "input"
    ]


def test_a_typed_answer_is_the_tool_result_as_json() -> None:
    from pydantic import BaseModel

    class Price(BaseModel):
        eur: int

    pricer = Agent(ScriptedModel(lambda r: {"eur": 1500}), name="pricer", output_type=Price)
    parent = Agent(ScriptedModel(fan_out("pricer")), subagents=[pricer])
    assert parent.generate("go").text == '{"eur": 1500}'


def test_a_failed_or_blocked_child_is_a_tool_error_the_model_reads() -> None:
    def raises(request: ModelRequest) -> str:
        raise RuntimeError("no luck")

    broken = Agent(ScriptedModel(raises), name="broken")
    guarded = Agent(ScriptedModel(lambda r: "x"), name="guarded",
                    input_guardrails=[lambda ctx, m: GuardrailResult.trip("not this")])  # fmt: skip
    parent = Agent(ScriptedModel(fan_out("broken", "guarded")), subagents=[broken, guarded])
    assert parent.generate("go").text == (
        "Error: the sub-agent 'broken' failed: no luck | Error: the sub-agent 'guarded'"
        " blocked: input guardrail '<lambda>' tripped: not this"
    )


def test_nesting_past_the_depth_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVOQ_SUBAGENT_MAX_DEPTH", "2")

    def model(request: ModelRequest) -> Any:
        results = [m.text for m in request.messages if m.role == "tool"]
        if results:
            return f"up({results[0]})"
        return Message.assistant("", [ToolCall(id="d", name="me", arguments={"input": "again"})])

    me = Agent(ScriptedModel(model), name="me")
    me.tools = ToolRegistry([me.as_tool()])
    text = me.generate("go").text
    assert text.startswith("up(up(up(Error: sub-agent calls may nest 2 deep"), text


def test_a_step_past_the_fan_out_limit_has_its_calls_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONVOQ_SUBAGENT_MAX_FANOUT", "2")
    called: list[str] = []
    subs = [Agent(ScriptedModel(lambda r, n=n: called.append(n) or n), name=n) for n in "xyz"]
    text = Agent(ScriptedModel(fan_out("x", "y", "z")), subagents=subs).generate("go").text
    assert called == [] and text.count("at most 2 sub-agent calls may run at once") == 3


def test_profile_names_are_refused_in_process_before_any_model_call() -> None:
    model = ScriptedModel(fan_out("critic"))
    with pytest.raises(ConfigurationError, match="'critic' is a worker profile name") as caught:
        Agent(model, subagents=["critic"]).generate("go")
    assert caught.value.details == {"option": "subagents", "profile": "critic"}
    assert model.call_count == 0


@pytest.mark.parametrize(
    ("value", "match"),
    [(Agent(ScriptedModel(lambda r: "x")), "a sub-agent needs a name"), (42, "not int")],
)
def test_bad_subagents_are_refused_when_the_agent_is_made(value: Any, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        Agent(ScriptedModel(lambda r: "x"), subagents=[value])


def test_in_process_a_response_s_usage_sums_its_children_and_lists_them() -> None:
    from convoq.usage import Usage

    used = Usage(requests=1, prompt_tokens=7, completion_tokens=1, total_tokens=8)

    def grandchild_model(request: ModelRequest) -> Message:
        return Message.assistant("deep", usage=used)

    def broken_model(request: ModelRequest) -> Message:
        raise RuntimeError("no luck")

    def child_model(request: ModelRequest) -> Message:
        if request.messages[-1].role == "tool":
            return Message.assistant("ok", usage=used)
        call = ToolCall(id="g", name="grandchild", arguments={"input": "down"})
        return Message.assistant("", [call], usage=used)

    grandchild = Agent(ScriptedModel(grandchild_model), name="grandchild")
    child = Agent(ScriptedModel(child_model), name="child", subagents=[grandchild])
    broken = Agent(ScriptedModel(broken_model), name="broken")
    parent = Agent(ScriptedModel(fan_out("child", "broken")), subagents=[child, broken])
    response = parent.generate("go", conversation_id="p")
    # The parent's two calls report nothing; the child's two and its grandchild's one do.
    assert response.usage.requests == 2 + 2 + 1 and response.usage.total_tokens == 3 * 8
    made = {c.agent: c for c in response.children}
    assert set(made) == {"child", "broken"}  # the grandchild is its child's, not the parent's
    assert (made["child"].status, made["child"].usage.requests) == ("succeeded", 3)
    assert (made["broken"].status, made["broken"].usage) == ("failed", Usage())
    # The child conversation derives from the parent's and the call (child_ids).
    assert made["child"].call_id == "c0" and made["child"].conversation_id.startswith("p~sub~")
    assert len(made["child"].turn_id) == 32 and made["child"].turn_id != made["broken"].turn_id


def test_a_callback_lists_at_most_64_children_with_their_ids_cut() -> None:
    import json

    from convoq.queue.signing import build_payload

    child = {"call_id": "c" * 1000, "agent": "a", "conversation_id": "x", "turn_id": "t",
             "status": "succeeded", "usage": {"requests": 1}, "secret": "not shown"}  # fmt: skip
    body = build_payload(conversation_id="c", turn_id="t", status="succeeded", agent="a",
                         text="", error=None, finished_ms=1, children=[child] * 100,
                         parent={"conversation_id": "p", "turn_id": "q", "call_id": "r",
                                 "depth": 2})  # fmt: skip
    payload = json.loads(body)
    assert len(payload["children"]) == 64
    shown = payload["children"][0]
    assert len(shown["call_id"]) == 256 and "secret" not in shown
    assert shown["usage"] == {"requests": 1}
    assert payload["parent"] == {"conversation_id": "p", "turn_id": "q", "call_id": "r", "depth": 2}

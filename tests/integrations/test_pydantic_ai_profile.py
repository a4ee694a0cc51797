"""The Pydantic AI profile on its own (no worker): message conversion without loss,
reruns from every journaled step, typed output, denials, cancellation, deps, how the
agents module finds such profiles, and bad input."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, CallDeferred, ModelRetry, RunContext
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RequestUsage

from convoq.engine import Completed, Paused
from convoq.errors import ConfigurationError, ConvoqError, TurnCancelledError
from convoq.integrations._pydantic_ai_messages import to_convoq, to_pydantic_ai
from convoq.integrations.pydantic_ai import DurableAgent, durable
from convoq.messages import (
    FilePart,
    ImagePart,
    Message,
    MessageRole,
    messages_from_json,
    messages_to_json,
)
from convoq.profile import AgentProfile, TurnJob
from convoq.turn_state import Decision, TurnEvent, TurnState, expire_undecided
from convoq.waits import WaitForSignal
from convoq.worker.profiles import load_profiles

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
PDF = b"%PDF-1.4 \x00\xff binary"


def _conversation() -> list[ModelMessage]:
    return [
        ModelRequest(
            parts=[
                SystemPromptPart("You are a bank."),
                UserPromptPart(
                    [
                        "look",
                        BinaryContent(PNG, media_type="image/png"),
                        BinaryContent(PDF, media_type="application/pdf", identifier="a.pdf"),
                    ]
                ),
            ],
            instructions="Be brief.",
        ),
        ModelResponse(
            parts=[
                ThinkingPart("the user wants a balance", signature="sig-1"),
                TextPart("Checking."),
                ToolCallPart("balance", {"account": "x"}, tool_call_id="c1"),
                ToolCallPart("fees", {}, tool_call_id="c2"),
            ],
            usage=RequestUsage(input_tokens=12, output_tokens=7, cache_read_tokens=3),
            model_name="m-1",
            finish_reason="tool_call",
        ),
        ModelRequest(
            parts=[
                ToolReturnPart("balance", {"eur": 5}, tool_call_id="c1"),
                ToolReturnPart("fees", "no such account", tool_call_id="c2", outcome="retried"),
            ]
        ),
        ModelResponse(
            parts=[TextPart("You have 5 EUR.")], usage=RequestUsage(input_tokens=4, output_tokens=2)
        ),
    ]


def test_messages_survive_the_trip_through_convoq_json_unchanged() -> None:
    original = _conversation()
    stored = messages_from_json(messages_to_json(to_convoq(original)))
    back = to_pydantic_ai(stored)
    # As exact as Pydantic AI's own JSON form of them, byte for byte.
    assert ModelMessagesTypeAdapter.dump_json(back) == ModelMessagesTypeAdapter.dump_json(original)
    assert back == ModelMessagesTypeAdapter.validate_json(
        ModelMessagesTypeAdapter.dump_json(original)
    )


def test_convoq_reads_the_portable_fields_and_stores_bytes_once() -> None:
    user, assistant, balance, fees, answer = to_convoq(_conversation())
    assert user.role == MessageRole.USER and user.text == "look"
    assert [type(p) for p in user.attachments] == [ImagePart, FilePart]
    assert user.attachments[0].data == PNG and user.attachments[1].data == PDF
    assert isinstance(user.attachments[1], FilePart) and user.attachments[1].filename == "a.pdf"
    assert user.framework is not None  # the record keeps no copy of the bytes
    assert base64.b64encode(PNG).decode() not in json.dumps(user.framework)
    assert assistant.text == "Checking." and [c.id for c in assistant.tool_calls] == ["c1", "c2"]
    assert assistant.usage is not None and assistant.usage.prompt_tokens == 12
    assert assistant.usage.cached_tokens == 3
    assert (balance.role, balance.tool_call_id, balance.text) == (
        MessageRole.TOOL,
        "c1",
        '{"eur":5}',
    )
    retried = _conversation()[2].parts[1]
    assert isinstance(retried, ToolReturnPart)
    assert (fees.tool_call_id, fees.text) == ("c2", retried.model_response_str())
    assert answer.text == "You have 5 EUR."


def test_turns_of_convoq_agents_read_as_pydantic_ai_messages() -> None:
    call = Message.assistant(
        "", [__import__("convoq").ToolCall(id="k", name="t", arguments={"a": 1})]
    )
    image = Message(role=MessageRole.USER, content=[ImagePart(data=PNG, mime_type="image/png")])
    tool = Message.tool_result(call.tool_calls[0], "42")
    request, response, result = to_pydantic_ai([image, call, tool])
    assert request == ModelRequest(
        parts=[
            UserPromptPart(
                [BinaryContent(PNG, media_type="image/png")], timestamp=request.parts[0].timestamp
            )
        ]  # type: ignore[union-attr]
    )
    assert isinstance(response, ModelResponse) and response.tool_calls[0].args == {"a": 1}
    assert isinstance(result, ModelRequest)
    assert result.parts[0] == ToolReturnPart(
        "t", "42", tool_call_id="k", timestamp=result.parts[0].timestamp
    )  # type: ignore[union-attr]


@dataclass
class Recorder:
    """The worker's side of a TurnJob, in memory: journaled states and events."""

    states: list[TurnState] = field(default_factory=list)
    events: list[TurnEvent] = field(default_factory=list)
    cancelled: bool = False

    async def checkpoint(self, state: TurnState) -> None:
        self.states.append(state.model_copy(deep=True))

    async def emit(self, event: TurnEvent) -> None:
        self.events.append(event)

    async def should_stop(self) -> bool:
        return self.cancelled

    def job(self, state: TurnState, history: list[Message] | None = None) -> TurnJob:
        return TurnJob(
            "c", "t", "p", state, history or [], self.emit, self.checkpoint, self.should_stop
        )


def _counting_agent(counts: dict[str, int]) -> Agent[str, str]:
    """Model request k is counted as ``model{k}``, a tool call as its call id. Request 1
    asks for ``add`` (a) and ``flaky`` (f, which asks for a retry); request 2 for
    ``flaky`` again (f2); request 3 answers."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = sum(isinstance(m, ModelResponse) for m in messages) + 1
        counts[f"model{n}"] = counts.get(f"model{n}", 0) + 1
        if n == 1:
            return ModelResponse(
                parts=[ToolCallPart("add", {"a": 1}, tool_call_id="a"),
                       ToolCallPart("flaky", {}, tool_call_id="f")]
            )  # fmt: skip
        if n == 2:
            return ModelResponse(parts=[ToolCallPart("flaky", {}, tool_call_id="f2")])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), name="p", deps_type=str)

    def counted(ctx: RunContext[str]) -> None:
        key = ctx.tool_call_id or ""
        counts[key] = counts.get(key, 0) + 1

    @agent.tool
    def add(ctx: RunContext[str], a: int) -> int:
        counted(ctx)
        return a + 1

    @agent.tool
    def flaky(ctx: RunContext[str]) -> str:
        counted(ctx)
        if ctx.tool_call_id == "f":
            raise ModelRetry("try once more")
        return "ok"

    return agent


def _finished(state: TurnState) -> set[str]:
    """The steps a journaled state holds: model requests and tool calls."""
    tools = {m.tool_call_id or "" for m in state.messages if m.role == MessageRole.TOOL}
    return tools | {f"model{k}" for k in range(1, state.steps + 1)}


async def test_a_rerun_from_any_journaled_step_repeats_no_finished_step() -> None:
    counts: dict[str, int] = {}
    profile = durable(_counting_agent(counts))
    recorder = Recorder()
    done = await profile.run_turn(recorder.job(TurnState.start(Message.user("hi"))))
    assert isinstance(done, Completed) and done.text == "done" and done.steps == 3
    assert counts == {"model1": 1, "a": 1, "f": 1, "model2": 1, "f2": 1, "model3": 1}
    assert len(recorder.states) == 6  # 3 model responses, 3 tool results
    for state in recorder.states:
        counts.clear()
        again = await profile.run_turn(Recorder().job(state))
        assert isinstance(again, Completed) and again.text == "done"
        assert not set(counts) & _finished(state)
        assert set(counts) | _finished(state) == {"model1", "a", "f", "model2", "f2", "model3"}
        assert [m.role for m in again.messages] == [m.role for m in done.messages]


async def test_each_step_is_journaled_before_the_run_goes_on() -> None:
    counts: dict[str, int] = {}
    recorder = Recorder()
    await durable(_counting_agent(counts)).run_turn(
        recorder.job(TurnState.start(Message.user("hi")))
    )
    shapes = [([m.role.value for m in s.messages], s.steps) for s in recorder.states]
    assert shapes[0] == (["user", "assistant"], 1)
    assert sorted(s.messages[-1].tool_call_id or "" for s in recorder.states[1:3]) == ["a", "f"]
    assert recorder.states[-1].messages[-1].text == "done"
    types = [e.type for e in recorder.events]
    assert types.count("assistant") == 3 and types.count("tool_call") == 3


class Answer(BaseModel):
    amount: int
    currency: str


async def test_a_typed_output_comes_out_as_json() -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        [tool] = info.output_tools
        return ModelResponse(parts=[ToolCallPart(tool.name, {"amount": 3, "currency": "EUR"})])

    agent = Agent(FunctionModel(model), name="typed", output_type=Answer)
    done = await durable(agent).run_turn(Recorder().job(TurnState.start(Message.user("how much"))))
    assert isinstance(done, Completed) and done.output is not None
    assert done.output.data == {"amount": 3, "currency": "EUR"}


def _paying_agent(paid: list[int]) -> Agent[None, str]:
    """Asks for ``pay`` (which needs approval), then for ``note``, then answers with what
    ``pay`` returned."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = {
            p.tool_name: str(p.content)
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, ToolReturnPart)
        }
        if "note" in returns:
            return ModelResponse(parts=[TextPart(returns["pay"])])
        if "pay" in returns:
            return ModelResponse(parts=[ToolCallPart("note", {}, tool_call_id="n")])
        return ModelResponse(parts=[ToolCallPart("pay", {"amount": 9}, tool_call_id="p")])

    agent = Agent(FunctionModel(model), name="payer")

    @agent.tool_plain(requires_approval=True)
    def pay(amount: int) -> str:
        paid.append(amount)
        return f"paid {amount}"

    @agent.tool_plain
    def note() -> str:
        return "noted"

    return agent


async def test_a_denied_call_tells_the_model_why_and_never_runs() -> None:
    paid: list[int] = []
    profile = durable(_paying_agent(paid))
    recorder = Recorder()
    parked = await profile.run_turn(recorder.job(TurnState.start(Message.user("pay"))))
    assert isinstance(parked, Paused) and [c.id for c in parked.pending] == ["p"]
    assert [e.type for e in recorder.events][-1] == "approval_required"
    parked.state.decide("p", False, "not today")
    done = await profile.run_turn(recorder.job(parked.state))
    assert isinstance(done, Completed) and paid == []
    assert (
        done.text == "The user denied this tool call: not today. It did not run; do not retry it."
    )
    tool = next(m for m in done.messages if m.name == "pay")
    assert tool.decision is not None and tool.decision.reason == "not today"
    # A rerun from any step journaled after the decision keeps it on the stored result.
    resumed = recorder.states[-1]
    assert resumed.messages[-1].text == done.text
    again = await profile.run_turn(Recorder().job(resumed))
    assert isinstance(again, Completed) and paid == []
    tool = next(m for m in again.messages if m.name == "pay")
    assert tool.decision is not None and tool.decision.reason == "not today"


async def test_an_expired_approval_is_a_denial_the_model_reads() -> None:
    paid: list[int] = []
    profile = durable(_paying_agent(paid))
    parked = await profile.run_turn(Recorder().job(TurnState.start(Message.user("pay"))))
    assert isinstance(parked, Paused)
    expire_undecided(parked.state, at_ms=1)
    done = await profile.run_turn(Recorder().job(parked.state))
    assert isinstance(done, Completed) and paid == []
    assert (
        done.text == "No one approved this tool call before its approval expired. It did not run."
    )


class PlainModel(Model):
    """A model that only answers whole (no ``request_stream``)."""

    async def request(self, messages: Any, settings: Any, parameters: Any) -> ModelResponse:
        return ModelResponse(parts=[TextPart("whole")])

    @property
    def model_name(self) -> str:
        return "plain"

    @property
    def system(self) -> str:
        return "test"


async def test_text_deltas_stream_when_the_model_can_and_whole_answers_otherwise() -> None:
    streamed, whole = Recorder(), Recorder()
    test_model = Agent(TestModel(custom_output_text="a b c"), name="s")
    await durable(test_model).run_turn(streamed.job(TurnState.start(Message.user("x"))))
    deltas = [e.data["text"] for e in streamed.events if e.type == "text_delta"]
    assert len(deltas) > 1 and "".join(deltas) == "a b c"
    plain = Agent(PlainModel(), name="p")
    done = await durable(plain).run_turn(whole.job(TurnState.start(Message.user("x"))))
    assert isinstance(done, Completed) and done.text == "whole"
    assert [e.type for e in whole.events] == ["assistant"]


async def test_a_cancelled_turn_stops_before_its_next_step() -> None:
    recorder = Recorder(cancelled=True)
    with pytest.raises(TurnCancelledError):
        await durable(_paying_agent([])).run_turn(recorder.job(TurnState.start(Message.user("x"))))
    assert recorder.states == []


def _remote_agent(seen: list[str]) -> Agent[None, str]:
    """Calls ``remote`` (deferred: CallDeferred with metadata), then answers with what the
    tool result said."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1].parts[0]
        if isinstance(last, ToolReturnPart | RetryPromptPart):
            seen.append(str(last.content))
            return ModelResponse(parts=[TextPart(f"got {last.content}")])
        return ModelResponse(parts=[ToolCallPart("remote", {}, tool_call_id="r1")])

    agent = Agent(FunctionModel(model), name="r")

    @agent.tool_plain
    def remote() -> str:
        raise CallDeferred(metadata={"job": 42})

    return agent


async def test_a_pydantic_ai_deferred_call_waits_for_its_result() -> None:
    seen: list[str] = []
    profile = durable(_remote_agent(seen))
    recorder = Recorder()
    parked = await profile.run_turn(recorder.job(TurnState.start(Message.user("x"))))
    assert isinstance(parked, Paused)
    assert [c.id for c in parked.state.pending] == ["r1"]
    assert parked.state.waits["r1"].on == "result"
    assert parked.state.waits["r1"].metadata == {"job": 42}
    assert [e.type for e in recorder.events if e.type == "deferred"] == ["deferred"]
    state = parked.state.model_copy(deep=True)
    state.decisions["r1"] = Decision(approved=True, result='{"done":true}')
    done = await profile.run_turn(Recorder().job(state))
    assert isinstance(done, Completed) and seen == ['{"done":true}']
    # Past its deadline (the profile's approval expiry) the model reads the error.
    expired = parked.state.model_copy(deep=True)
    expire_undecided(expired, at_ms=1)
    await profile.run_turn(Recorder().job(expired))
    assert "no result for this tool call arrived before its deadline" in seen[-1]


async def test_deps_come_from_the_profile_and_its_factory_once_per_process() -> None:
    made: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if isinstance(messages[-1].parts[0], ToolReturnPart):
            return ModelResponse(parts=[TextPart(str(messages[-1].parts[0].content))])
        return ModelResponse(parts=[ToolCallPart("whose", {})])

    agent = Agent(FunctionModel(model), name="d", deps_type=str)

    @agent.tool
    def whose(ctx: RunContext[str]) -> str:
        return str(ctx.deps)

    def factory() -> str:
        made.append(1)
        return "made once"

    profile = durable(agent, deps_factory=factory)
    for _ in range(2):
        done = await profile.run_turn(Recorder().job(TurnState.start(Message.user("x"))))
        assert isinstance(done, Completed) and done.text == "made once"
    assert made == [1]


def test_the_agents_module_yields_pydantic_ai_profiles_and_an_explicit_wrap_wins() -> None:
    from tests.support import pydantic_ai_agents as module

    profiles = load_profiles("tests.support.pydantic_ai_agents")
    assert sorted(profiles) == [
        "pai-budget", "pai-chat", "pai-payer", "pai-shipper", "pai-short", "pai-stream",
    ]  # fmt: skip
    assert profiles["pai-payer"] is module.payer_profile
    chat = profiles["pai-chat"]
    assert isinstance(chat, DurableAgent) and chat.agent is module.chat
    assert isinstance(chat, AgentProfile)


def test_bad_profiles_are_refused_with_what_to_do() -> None:
    with pytest.raises(ConfigurationError, match=r"takes a pydantic_ai\.Agent"):
        durable("not an agent")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="needs a name"):
        durable(Agent(FunctionModel(lambda m, i: ModelResponse(parts=[]))))
    with pytest.raises(ConfigurationError, match="keep_last_turns"):
        durable(Agent("test", name="x"), keep_last_turns=-1)
    with pytest.raises(ConvoqError, match="max_history_tokens must be"):
        durable(Agent("test", name="x"), max_history_tokens=-5)
    with pytest.raises(ConvoqError, match="deps or deps_factory"):
        durable(Agent("test", name="x"), deps=1, deps_factory=lambda: 2)  # ConvoqError


def test_without_the_extra_the_import_names_it() -> None:
    code = "import sys; sys.modules['pydantic_ai'] = None\nimport convoq.integrations.pydantic_ai\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0
    assert "pip install 'convoq[pydantic-ai]'" in done.stderr
    assert "ConfigurationError" in done.stderr


async def test_convoq_s_wait_inside_a_pydantic_ai_tool_is_refused_with_what_to_do() -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart("paid", {})])

    agent = Agent(FunctionModel(model), name="w")

    @agent.tool_plain
    def paid() -> str:
        raise WaitForSignal("paid")

    with pytest.raises(ConfigurationError, match="raise pydantic_ai's CallDeferred"):
        await durable(agent).run_turn(Recorder().job(TurnState.start(Message.user("x"))))

"""Typed outputs in process: the shape asked of the model, the answer validated and typed,
retried with the errors, then OutputValidationError; sync, async and streamed alike."""

from __future__ import annotations

import asyncio
import json
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from convoq import Agent, Message, ToolCall, tool
from convoq.engine import Completed, TurnLoop
from convoq.errors import (
    ConvoqError,
    InvalidOutputTypeError,
    OutputValidationError,
    error_from_data,
)
from convoq.memory import ConversationMemory, InMemoryConversationMemory
from convoq.messages import MessageRole
from convoq.models import ModelRequest, OutputSpec, ScriptedModel
from convoq.output import MAX_ANSWER_CHARS, output_shape
from convoq.tools import ToolRegistry
from convoq.turn_state import TurnState
from tests.support.memory_backends import backend_url, close_memory, make_memory


class City(BaseModel):
    name: str
    population: int


@dataclass
class Point:
    x: float
    y: float


CITY_SCHEMA: dict[str, Any] = {
    "title": "City",
    "type": "object",
    "properties": {"name": {"type": "string"}, "population": {"type": "integer", "minimum": 0}},
    "required": ["name", "population"],
    "additionalProperties": False,
}


def answers(*replies: Any) -> tuple[ScriptedModel, list[ModelRequest]]:
    """A scripted model giving ``replies`` in order, and the requests it saw."""
    seen: list[ModelRequest] = []
    pending = list(replies)

    def fn(request: ModelRequest) -> Any:
        seen.append(request)
        return pending.pop(0)

    return ScriptedModel(fn), seen


def test_a_pydantic_output_is_asked_for_validated_and_typed() -> None:
    model, seen = answers({"name": "Oslo", "population": 700000})
    response = Agent(model, output_type=City).generate("Which city?")
    assert response.output == City(name="Oslo", population=700000)
    assert response.output_data == {"name": "Oslo", "population": 700000}
    assert response.text == '{"name":"Oslo","population":700000}'  # as the model sent it
    spec = seen[0].output
    assert spec is not None and spec.name == "City" and spec.strict is True
    assert spec.json_schema["additionalProperties"] is False
    assert spec.json_schema["required"] == ["name", "population"]


def test_a_dataclass_and_a_json_schema_are_output_types_too() -> None:
    model, _ = answers(Point(1.5, 2))
    assert Agent(model, output_type=Point).generate("Where?").output == Point(1.5, 2.0)
    model, seen = answers('{"name": "Bergen", "population": 285000}')
    response = Agent(model, output_type=CITY_SCHEMA).generate("Which city?")
    assert response.output == {"name": "Bergen", "population": 285000}
    assert seen[0].output == OutputSpec(name="City", json_schema=CITY_SCHEMA, strict=True)


def test_optional_fields_make_the_request_non_strict() -> None:
    class Maybe(BaseModel):
        name: str
        note: str | None = None

    shape = output_shape(Maybe)
    assert shape is not None and shape.spec.strict is False
    # An OutputSpec given as is keeps its own strict flag.
    spec = OutputSpec(name="m", json_schema=shape.spec.json_schema, strict=True)
    given = output_shape(spec)
    assert given is not None and given.spec is spec
    assert output_shape({"type": "object", "properties": {"a": {"type": "string"}}}) is not None


def test_a_bad_answer_goes_back_with_its_errors_and_the_retry_is_stored() -> None:
    memory = InMemoryConversationMemory()
    model, seen = answers({"name": "Oslo"}, "```json\n" + '{"name": "Oslo", "population": 7}\n```')
    agent = Agent(model, output_type=City, memory=memory, conversation_id="c")
    response = agent.generate("Which city?")
    assert response.output == City(name="Oslo", population=7)
    retry = seen[1].messages[-1]
    assert retry.role == MessageRole.SYSTEM
    assert "$.population: Field required" in retry.text
    assert seen[1].messages[-2].text == '{"name":"Oslo"}'  # the rejected answer, as sent
    stored = memory.load("c")
    # What was really exchanged, in one turn: the user message is still the only one.
    roles = [m.role.value for m in stored]
    assert roles == ["user", "assistant", "system", "assistant"]
    assert response.usage.requests == 2


def test_retries_are_bounded_then_output_validation_error_carries_the_last_answer() -> None:
    memory = InMemoryConversationMemory()
    model, seen = answers("not json", '{"name": 3}', "never sent")
    agent = Agent(model, output_type=City, output_retries=1, memory=memory, conversation_id="c")
    with pytest.raises(OutputValidationError) as raised:
        agent.generate("Which city?")
    err = raised.value
    assert err.answer == '{"name": 3}'
    assert "$.name: Input should be a valid string" in err.errors
    assert "output_retries" in err.message
    assert len(seen) == 2  # one answer, one retry
    assert memory.load("c") == []  # a failed turn stores nothing
    # The error survives the trips errors take between processes.
    back = error_from_data(err.to_data())
    assert isinstance(back, OutputValidationError) and back.answer == '{"name": 3}'
    assert pickle.loads(pickle.dumps(err)).errors == err.errors


def test_zero_retries_fail_at_the_first_bad_answer() -> None:
    model, seen = answers("{}")
    with pytest.raises(OutputValidationError, match="after 0 retries"):
        Agent(model, output_type=City, output_retries=0).generate("Which city?")
    assert len(seen) == 1


def test_a_model_without_structured_output_gets_the_schema_in_its_instructions() -> None:
    seen: list[ModelRequest] = []

    def fn(request: ModelRequest) -> str:
        seen.append(request)
        return '{"name": "Oslo", "population": 1}'

    model = ScriptedModel(fn, structured_output=False)
    Agent(model, "Be brief.", output_type=City).generate("Which city?")
    lead = seen[0].messages[0]
    assert lead.role == MessageRole.SYSTEM and lead.text.startswith("Be brief.\n\n")
    assert '"population"' in lead.text and "JSON" in lead.text
    # A model that declares structured output gets the instructions as they are.
    model, seen = answers({"name": "Oslo", "population": 1})
    Agent(model, "Be brief.", output_type=City).generate("Which city?")
    assert seen[0].messages[0].text == "Be brief."


def test_a_call_overrides_the_agents_output_type() -> None:
    model, seen = answers({"x": 1, "y": 2}, "free text")
    agent = Agent(model, output_type=City)
    assert agent.generate("Where?", output_type=Point).output == Point(1, 2)
    assert seen[0].output is not None and seen[0].output.name == "Point"
    plain = Agent(answers("free text")[0])
    assert plain.generate("hi").output is None


def test_async_and_stream_give_the_typed_output() -> None:
    model, _ = answers({"name": "A", "population": 1}, {"name": "B", "population": 2})
    agent = Agent(model, output_type=City)
    response = asyncio.run(agent.agenerate("one"))
    assert response.output == City(name="A", population=1)
    events = list(agent.stream("two"))
    done = events[-1]
    assert done.type == "done" and done.data["output"] == {"name": "B", "population": 2}


def test_tool_calls_come_first_and_only_the_final_answer_is_validated() -> None:
    @tool
    def census(city: str) -> str:
        """Population of a city."""
        return "700000"

    call = Message.assistant("", [ToolCall(id="c1", name="census", arguments={"city": "Oslo"})])
    model, seen = answers(call, {"name": "Oslo", "population": 700000})
    response = Agent(model, output_type=City, tools=[census]).generate("Which city?")
    assert response.output == City(name="Oslo", population=700000)
    assert all(r.output is not None for r in seen)


def test_a_resumed_turn_keeps_its_output_type() -> None:
    @tool(requires_approval=True)
    def book(city: str) -> str:
        """Book a trip."""
        return "booked"

    call = Message.assistant("", [ToolCall(id="c1", name="book", arguments={"city": "Oslo"})])
    model, seen = answers(call, {"x": 0, "y": 1})
    agent = Agent(model, tools=[book])
    paused = agent.generate("Book it", output_type=Point)
    assert paused.status == "awaiting_approval"
    cont = json.loads(paused.continuation.model_dump_json())  # type: ignore[union-attr]
    # Resumed from JSON: the spec came along; the type given back makes it typed.
    assert agent.resume(cont, {"c1": True}, output_type=Point).output == Point(0, 1)
    assert seen[1].output is not None and seen[1].output.name == "Point"


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize(
    "bad",
    [
        int,
        str,
        City(name="a", population=1),  # an instance, not a type
        {"type": "string"},  # the answer's top level is an object
        {"type": "object", "patternProperties": {"^a": {}}},  # not checked: refused
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=a)"}}},
        {"type": "object", "properties": {"a": {"type": "strange"}}},
        {"type": "object", "properties": {"a": {"$ref": "https://example.test/s.json"}}},
        {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(5000)}},
        _nested(100),  # deeper than values are checked
        _nested(5000),  # deeper than JSON encodes: still a clear error
    ],
)
def test_bad_output_types_are_refused_before_any_model_call(bad: Any) -> None:
    model, seen = answers("unused")
    with pytest.raises(InvalidOutputTypeError) as raised:
        Agent(model, output_type=bad)
    assert str(raised.value)
    with pytest.raises(InvalidOutputTypeError):
        Agent(model).generate("hi", output_type=bad)
    assert seen == []


def test_a_turn_run_again_from_its_journal_goes_on_where_it_was() -> None:
    # The journal holds the rejected answer and the retry prompt: a rerun asks once more,
    # it does not start the retries over nor re-ask the first question.
    shape = output_shape(City)
    assert shape is not None
    first = Message.assistant('{"name": "Oslo"}')
    journaled = TurnState(messages=[Message.user("Which city?"), first], steps=1)
    journaled.messages.append(shape.judge(journaled.messages, 1))  # type: ignore[arg-type]
    model, seen = answers({"name": "Oslo", "population": 1})
    loop = TurnLoop(model=model, tools=ToolRegistry(), history=[], output=shape, output_retries=1)
    outcome = asyncio.run(loop.run(journaled.model_copy(deep=True)))
    assert isinstance(outcome, Completed) and outcome.output is not None
    assert outcome.output.value == City(name="Oslo", population=1) and len(seen) == 1
    # Journaled with the retry spent and a second bad answer: it fails without a call.
    spent = journaled.model_copy(deep=True)
    spent.messages.append(Message.assistant("{}"))
    model, seen = answers()
    loop = TurnLoop(model=model, tools=ToolRegistry(), history=[], output=shape, output_retries=1)
    with pytest.raises(OutputValidationError, match="after 1 retry:"):
        asyncio.run(loop.run(spent))
    assert seen == []


class _PlainModel:
    """A model of the user's own that says nothing about structured output."""

    name = "plain"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def request(self, request: ModelRequest, *, on_text_delta: Any = None) -> Message:
        self.requests.append(request)
        return Message.assistant('{"x": 1, "y": 2}')


def test_a_model_that_declares_nothing_gets_the_schema_in_its_instructions() -> None:
    model = _PlainModel()
    assert Agent(model, output_type=Point).generate("Where?").output == Point(1, 2)
    lead = model.requests[0].messages[0]
    assert lead.role == MessageRole.SYSTEM and '"x"' in lead.text


def test_a_resumed_turn_is_typed_by_the_agents_type_or_comes_back_as_json() -> None:
    @tool(requires_approval=True)
    def book(city: str) -> str:
        """Book a trip."""
        return "booked"

    def paused(agent: Agent, **call: Any) -> dict[str, Any]:
        response = agent.generate("Book it", **call)
        assert response.continuation is not None
        return json.loads(response.continuation.model_dump_json())

    call = Message.assistant("", [ToolCall(id="c1", name="book", arguments={"city": "Oslo"})])
    model, _ = answers(call, {"x": 0, "y": 1}, call, {"x": 2, "y": 3})
    typed_agent = Agent(model, tools=[book], output_type=Point)
    assert typed_agent.resume(paused(typed_agent), {"c1": True}).output == Point(0, 1)
    # A call's own type that the resuming side does not give: the output is its JSON.
    plain = Agent(model, tools=[book])
    assert plain.resume(paused(plain, output_type=Point), {"c1": True}).output == {"x": 2, "y": 3}


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2"])
def test_bad_output_retries_are_refused(bad: Any) -> None:
    with pytest.raises(ConvoqError, match="output_retries"):
        Agent(ScriptedModel(lambda _r: "x"), output_retries=bad)


def test_the_error_of_a_huge_answer_is_bounded() -> None:
    huge = '{"name": "' + "x" * 100_000 + '"}'
    model, _ = answers(huge)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}}}
    with pytest.raises(OutputValidationError) as raised:
        Agent(model, output_type=schema, output_retries=0).generate("Name?")
    assert len(raised.value.answer) == MAX_ANSWER_CHARS
    assert raised.value.errors and all(len(e) <= 300 for e in raised.value.errors)


@pytest.fixture(params=["in_memory", "file", "redis"])
def memory(
    request: pytest.FixtureRequest, tmp_path: Path, key_prefix: str
) -> Iterator[ConversationMemory]:
    url = backend_url(request, request.param)
    memory = make_memory(request.param, tmp_path, url, key_prefix)
    yield memory
    close_memory(memory)


def test_a_retried_turn_is_stored_and_windowed_as_one_turn(memory: ConversationMemory) -> None:
    model, seen = answers(
        {"x": 1}, {"x": 1, "y": 2},  # the first turn: rejected once, then fits
        {"x": 3, "y": 4}, {"x": 5, "y": 6}, {"x": 7, "y": 8},
    )  # fmt: skip
    agent = Agent(model, output_type=Point, memory=memory, conversation_id="c")
    agent.generate("first")
    agent.generate("second")
    roles = [m.role.value for m in memory.load("c")]
    assert roles == ["user", "assistant", "system", "assistant", "user", "assistant"]
    # The retry prompt did not open a turn: the last two turns are all six messages.
    agent.generate("third", keep_last_turns=2)
    assert [m.text for m in seen[-1].messages if m.role == MessageRole.USER] == [
        "first", "second", "third",
    ]  # fmt: skip
    assert len(seen[-1].messages) == 7
    agent.generate("fourth", keep_last_turns=1)
    assert [m.text for m in seen[-1].messages] == ["third", '{"x":5,"y":6}', "fourth"]

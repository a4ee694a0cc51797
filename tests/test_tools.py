"""@tool schemas, argument validation, failing tools and max_steps."""

from __future__ import annotations

from typing import Literal

import pytest

from convoq import Agent, Message, ToolCall, tool
from convoq.errors import MaxStepsExceededError, ToolError
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel
from tests.support.models import call_tool_then_answer


@tool
def get_weather(city: str, unit: Literal["c", "f"] = "c", days: int = 1) -> str:
    """Weather for a city."""
    return f"{city}: sunny, {days}d in {unit}"


def test_schema_from_type_hints() -> None:
    spec = get_weather.spec
    assert spec.name == "get_weather" and spec.description == "Weather for a city."
    props = spec.parameters["properties"]
    assert props["city"]["type"] == "string"
    assert props["unit"]["enum"] == ["c", "f"] and props["unit"]["default"] == "c"
    assert props["days"]["type"] == "integer"
    assert spec.parameters["required"] == ["city"]
    assert spec.parameters["additionalProperties"] is False


def test_arguments_are_validated() -> None:
    assert get_weather.validate({"city": "Paris", "days": "3"}) == {
        "city": "Paris", "unit": "c", "days": 3,
    }  # fmt: skip
    with pytest.raises(ToolError, match="city"):
        get_weather.validate({})
    with pytest.raises(ToolError, match="unit"):
        get_weather.validate({"city": "x", "unit": "k"})
    with pytest.raises(ToolError, match="bogus: Extra inputs"):
        get_weather.validate({"city": "x", "bogus": 1})


def test_varargs_cannot_be_a_tool() -> None:
    with pytest.raises(ToolError, match="args"):
        tool(lambda *a: None)


def test_a_raising_tool_becomes_a_tool_result() -> None:
    @tool
    def broken(x: int) -> str:
        raise RuntimeError("kaput")

    agent = Agent(ScriptedModel(call_tool_then_answer("broken", {"x": 1})), tools=[broken])
    r = agent.generate("go")
    assert r.status == "completed"
    assert r.text == "tool said: Error: RuntimeError: kaput"


def test_invalid_arguments_and_unknown_tools_are_reported_to_the_model() -> None:
    agent = Agent(ScriptedModel(call_tool_then_answer("get_weather", {"town": "x"})),
                  tools=[get_weather])  # fmt: skip
    assert "invalid arguments for tool 'get_weather'" in agent.generate("go").text
    agent = Agent(ScriptedModel(call_tool_then_answer("nope", {})), tools=[get_weather])
    assert "unknown tool 'nope'" in agent.generate("go").text


def test_max_steps_bounds_the_loop() -> None:
    def always_tools(request: ModelRequest) -> Message:
        return Message(role="assistant", tool_calls=[
            ToolCall(id=f"c{len(request.messages)}", name="get_weather", arguments={"city": "x"})
        ])  # fmt: skip

    model = ScriptedModel(always_tools)
    agent = Agent(model, tools=[get_weather], max_steps=3)
    with pytest.raises(MaxStepsExceededError, match="max_steps"):
        agent.generate("loop")
    assert len(model.calls) == 3


async def test_async_tools_and_tool_specs_are_sent() -> None:
    @tool(name="lookup", description="Find a thing.")
    async def find(q: str) -> dict[str, str]:
        return {"found": q}

    model = ScriptedModel(call_tool_then_answer("lookup", {"q": "ada"}))
    r = await Agent(model, tools=[find]).agenerate("go")
    assert r.text == 'tool said: {"found": "ada"}'
    assert [t.name for t in model.calls[0].tools] == ["lookup"]
    tool_msgs = [m for m in r.turn if m.role == MessageRole.TOOL]
    assert tool_msgs[0].tool_call_id and tool_msgs[0].name == "lookup"


def test_duplicate_tool_names_are_refused() -> None:
    with pytest.raises(ToolError, match="two tools"):
        Agent(ScriptedModel(lambda r: "x"), tools=[get_weather, get_weather])

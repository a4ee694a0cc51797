"""Model settings: checked where they enter, merged agent < call, seen by the model, and
mapped to Chat Completions fields on the wire (a loopback server records the bodies)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from convoq import Agent, tool
from convoq.errors import InvalidModelSettingsError
from convoq.messages import Message
from convoq.model_settings import coerce_settings, merge_settings
from convoq.models import ModelRequest, ModelSettings, OutputSpec, ScriptedModel, openai
from convoq.models._openai_wire import build_body
from tests.support.openai_server import OpenAIServer


@tool
def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


def recording() -> tuple[ScriptedModel, list[ModelRequest]]:
    seen: list[ModelRequest] = []

    def fn(request: ModelRequest) -> str:
        seen.append(request)
        return "ok"

    return ScriptedModel(fn), seen


def test_call_settings_merge_over_the_agents_and_reach_the_model() -> None:
    model, seen = recording()
    agent = Agent(
        model, model_settings={"temperature": 0.2, "max_tokens": 100, "extra_body": {"a": 1}}
    )
    agent.generate("hi")
    assert seen[0].settings == ModelSettings(temperature=0.2, max_tokens=100, extra_body={"a": 1})
    agent.generate("hi", model_settings=ModelSettings(temperature=0.9, extra_body={"b": 2}))
    assert seen[1].settings == ModelSettings(
        temperature=0.9, max_tokens=100, extra_body={"a": 1, "b": 2}
    )
    events = list(agent.stream("hi", model_settings={"seed": 7}))
    assert events[-1].type == "done" and seen[2].settings is not None
    assert (seen[2].settings.seed, seen[2].settings.temperature) == (7, 0.2)
    asyncio.run(agent.agenerate("hi", model_settings={"top_p": 0.5}))
    assert seen[3].settings is not None and seen[3].settings.top_p == 0.5
    # Without settings anywhere, the request carries none: the server's defaults.
    plain, seen_plain = recording()
    Agent(plain).generate("hi")
    assert seen_plain[0].settings is None


def test_merge_keeps_the_base_where_the_override_says_nothing() -> None:
    base = ModelSettings(temperature=0.1, stop=["x"])
    assert merge_settings(base, None) is base
    assert merge_settings(None, base) is base
    merged = merge_settings(base, ModelSettings(stop=["y"], tool_choice="none"))
    assert merged == ModelSettings(temperature=0.1, stop=["y"], tool_choice="none")


def _deep(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


BAD_SETTINGS: list[Any] = [
    {"temperature": 2.5},
    {"temperature": "hot"},
    {"top_p": -0.1},
    {"max_tokens": 0},
    {"max_tokens": True},  # a bool is no count
    {"seed": 1.5},
    {"stop": "end"},  # a list of strings
    {"stop": ["a", "b", "c", "d", "e"]},  # at most 4
    {"stop": ["x" * 257]},  # each bounded
    {"stop": [""]},
    {"tool_choice": "call me!"},  # not a tool name
    {"tool_choice": 3},
    {"parallel_tool_calls": "yes"},
    {"extra_body": {"x": float("nan")}},  # not JSON
    {"extra_body": {"x": "y" * 20000}},  # over MAX_EXTRA_BODY_BYTES
    {"extra_body": _deep(5000)},  # deeper than JSON encodes
    {"temprature": 0.5},  # unknown field (typo)
    "temperature=0.5",
]


@pytest.mark.parametrize("bad", BAD_SETTINGS)
def test_bad_settings_are_refused_before_any_model_call(bad: Any) -> None:
    model, seen = recording()
    with pytest.raises(InvalidModelSettingsError) as raised:
        Agent(model, model_settings=bad)
    assert "model_settings" in str(raised.value)
    with pytest.raises(InvalidModelSettingsError):
        Agent(model).generate("hi", model_settings=bad)
    assert seen == []


def test_a_named_tool_choice_must_name_a_tool_of_the_agent() -> None:
    model, seen = recording()
    with pytest.raises(InvalidModelSettingsError, match=r"'search'.*lookup"):
        Agent(model, tools=[lookup], model_settings={"tool_choice": "search"})
    agent = Agent(model, tools=[lookup])
    with pytest.raises(InvalidModelSettingsError, match="search"):
        agent.generate("hi", model_settings={"tool_choice": "search"})
    assert seen == []
    assert coerce_settings({"tool_choice": "lookup"}) == ModelSettings(tool_choice="lookup")


def test_settings_map_to_chat_completions_fields_with_extra_body_last() -> None:
    settings = ModelSettings(
        temperature=0.3, max_tokens=64, top_p=0.9, stop=["END"], seed=11,
        tool_choice="lookup", parallel_tool_calls=False,
        extra_body={"temperature": 0.4, "user": "u1"},
    )  # fmt: skip
    spec = lookup.spec
    request = ModelRequest(messages=[Message.user("hi")], tools=[spec], settings=settings)
    body = build_body("m", request, stream=False, extra_body={"user": "model", "logprobs": True})
    assert body["max_completion_tokens"] == 64 and "max_tokens" not in body
    assert body["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert body["parallel_tool_calls"] is False
    assert (body["top_p"], body["stop"], body["seed"]) == (0.9, ["END"], 11)
    # The model's extra_body, then the request's: the request's keys win.
    assert (body["temperature"], body["user"], body["logprobs"]) == (0.4, "u1", True)
    # Without tools the API refuses tool_choice and parallel_tool_calls: not sent.
    bare = build_body("m", ModelRequest(messages=[Message.user("hi")], settings=settings),
                      stream=False, extra_body=None)  # fmt: skip
    assert "tool_choice" not in bare and "parallel_tool_calls" not in bare
    assert build_body("m", ModelRequest(messages=[Message.user("x")]), stream=False,
                      extra_body=None).keys() == {"model", "messages"}  # fmt: skip


class Answer(BaseModel):
    verdict: str


def test_the_openai_model_sends_settings_and_response_format_over_http() -> None:
    with OpenAIServer() as server:
        server.reply_text('{"verdict": "yes"}')
        server.reply_text('{"verdict": "no"}')
        model = openai("gpt-test", base_url=server.url, api_key="k")
        agent = Agent(model, output_type=Answer, model_settings={"max_tokens": 20})
        response = agent.generate("Well?", model_settings={"tool_choice": "auto", "seed": 3})
        assert response.output == Answer(verdict="yes")
        body = server.requests[0].json
        assert body["response_format"] == {
            "type": "json_schema",
            "json_schema": {
                "name": "Answer",
                "strict": True,
                "schema": Answer.model_json_schema() | {"additionalProperties": False},
            },
        }
        assert (body["max_completion_tokens"], body["seed"]) == (20, 3)
        assert "tool_choice" not in body  # no tools on offer
        # A server that cannot take a schema: none is sent, the instructions carry it.
        plain = openai("gpt-test", base_url=server.url, api_key="k", structured_output=False)
        assert Agent(plain, output_type=Answer).generate("Well?").output == Answer(verdict="no")
        body = server.requests[1].json
        assert "response_format" not in body
        assert body["messages"][0]["role"] == "system"
        assert '"verdict"' in body["messages"][0]["content"]


def test_streamed_requests_carry_the_settings_too() -> None:
    with OpenAIServer() as server:
        server.reply_text('{"verdict": "streamed"}')
        model = openai("gpt-test", base_url=server.url, api_key="k")
        events = list(Agent(model, output_type=Answer).stream("Well?", model_settings={
            "temperature": 0.0, "stop": ["\n\n"]}))  # fmt: skip
        assert events[-1].data["output"] == {"verdict": "streamed"}
        body = server.requests[0].json
        assert body["stream"] is True and body["temperature"] == 0.0
        assert body["stop"] == ["\n\n"] and body["response_format"]["type"] == "json_schema"


def test_an_output_spec_given_as_is_is_sent_as_is() -> None:
    spec = OutputSpec(name="v", json_schema={"type": "object"}, strict=False)
    request = ModelRequest(messages=[Message.user("x")], output=spec)
    body = build_body("m", request, stream=False, extra_body=None)
    assert body["response_format"]["json_schema"] == {
        "name": "v", "schema": {"type": "object"}, "strict": False,
    }  # fmt: skip
    off = build_body("m", request, stream=False, extra_body=None, structured_output=False)
    assert "response_format" not in off

"""Where system and developer messages travel on each model wire, and the sampling settings
the pinned Anthropic API version takes: checked on the requests a loopback server received
(Anthropic bodies against the anthropic SDK's request types, see tests/support/sdk_wire.py).

Only the leading system/developer run is Anthropic's ``system``; a later one (a typed
output's retry prompt, a framework's mid-conversation note) keeps its place as user-side
text, so a retry request ends with the correction as a user turn, never with the rejected
answer as an assistant prefill, and the next turn carries no retry prompt in ``system``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic as sdk
import pytest
from pydantic import BaseModel

from convoq import Agent
from convoq.errors import ModelError
from convoq.memory import InMemoryConversationMemory
from convoq.messages import Message, MessageRole, TextPart, ToolCall
from convoq.models import Model, ModelRequest, ModelSettings, anthropic, openai, responses
from convoq.models.anthropic import API_VERSION
from convoq.summary import SUMMARY_PREFIX
from tests.support import sdk_wire as w
from tests.support.openai_server import OpenAIServer

Json = dict[str, Any]


class City(BaseModel):
    name: str
    population: int


REJECTED = {"name": "Oslo"}  # population missing: does not fit City
OSLO = {"name": "Oslo", "population": 709000}
BERGEN = {"name": "Bergen", "population": 285000}


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as running:
        yield running


def claude(server: OpenAIServer) -> Model:
    return anthropic("claude-x", base_url=server.url.removesuffix("/v1"), api_key="k")


def checked(server: OpenAIServer) -> list[Json]:
    """The Anthropic request bodies received, each a valid SDK request of the pinned version."""
    bodies = [request.json for request in server.requests]
    for body in bodies:
        w.check_anthropic_body(body)
    return bodies


def text(block_list: list[Json]) -> list[str]:
    return [b["text"] for b in block_list if b["type"] == "text"]


async def test_only_the_leading_system_run_is_system_later_ones_keep_their_place(
    server: OpenAIServer,
) -> None:
    call = ToolCall(id="toolu_1", name="get_weather", arguments={"city": "Oslo"})
    history = [
        Message.system("Be brief."),
        Message(role=MessageRole.DEVELOPER, content=[TextPart(text="Use metric units.")]),
        Message.system(SUMMARY_PREFIX + "The user lives in Oslo."),  # right after the lead
        Message.system(""),  # empty text, which the API refuses: left out, here and later
        Message.user("Weather?"),
        Message(role=MessageRole.DEVELOPER, content=[]),
        Message.assistant("Looking.", [call]),
        Message.tool_result(call, "sunny"),
        Message.system("The user switched to a phone."),  # a framework's mid-history note
        Message.user("And tomorrow?"),
        Message.assistant("Rain."),
        Message(role=MessageRole.DEVELOPER, content=[TextPart(text="Answer in French now.")]),
    ]
    server.reply_raw(w.anthropic_message([w.text_block("Pluie.")]).model_dump_json())
    async with claude(server) as model:
        await model.request(ModelRequest(messages=history))
    (body,) = checked(server)
    assert text(body["system"]) == [
        "Be brief.",
        "Use metric units.",
        SUMMARY_PREFIX + "The user lives in Oslo.",
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                 "input": {"city": "Oslo"}},
            ],
        },
        {
            # In order: the tool result, the mid-history note, then the user's question.
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "text", "text": "The user switched to a phone."},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Rain."}]},
        {"role": "user", "content": [{"type": "text", "text": "Answer in French now."}]},
    ]  # fmt: skip


# -- a typed-output retry, and the turn after it, on each wire -------------------------------


@dataclass(frozen=True)
class Wire:
    """One model API: its model, how the server answers with a JSON text, and the request
    body flattened to ``(role, text)`` pairs in the order the model reads them."""

    name: str
    model: Callable[[OpenAIServer], Model]
    reply: Callable[[OpenAIServer, Json], None]
    flat: Callable[[Json], list[tuple[str, str]]]
    later_system_role: str  # the role a system message after the lead arrives as
    check: Callable[[Json], None] = lambda body: None


def _chat_flat(body: Json) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in body["messages"]]


def _responses_flat(body: Json) -> list[tuple[str, str]]:
    return [(i["role"], i["content"]) for i in body["input"] if i.get("type") == "message"]


def _anthropic_flat(body: Json) -> list[tuple[str, str]]:
    flat = [("system", t) for t in text(body.get("system") or [])]
    return flat + [(m["role"], t) for m in body["messages"] for t in text(m["content"])]


def _anthropic_reply(server: OpenAIServer, answer: Json) -> None:
    # The typed output comes back as the forced output tool's input (output_mode="tool").
    block = w.tool_use_block("toolu_out", "City", answer)
    server.reply_raw(w.anthropic_message([block], stop_reason="tool_use").model_dump_json())


WIRES = [
    Wire(
        "chat",
        lambda s: openai("gpt-x", base_url=s.url, api_key="k"),
        lambda s, answer: s.reply_text(json.dumps(answer)),
        _chat_flat,
        "system",
    ),
    Wire(
        "responses",
        lambda s: responses("gpt-x", base_url=s.url, api_key="k"),
        lambda s, answer: s.reply_raw(
            w.response([w.text_item(json.dumps(answer))]).model_dump_json()
        ),
        _responses_flat,
        "system",
        w.check_responses_body,
    ),
    Wire("anthropic", claude, _anthropic_reply, _anthropic_flat, "user", w.check_anthropic_body),
]


@pytest.mark.parametrize("wire", WIRES, ids=lambda wire: wire.name)
def test_a_typed_output_retry_ends_with_the_correction_and_stays_in_place(
    server: OpenAIServer, wire: Wire
) -> None:
    memory = InMemoryConversationMemory()
    agent = Agent(wire.model(server), instructions="Be brief.", output_type=City,
                  memory=memory, conversation_id="c")  # fmt: skip
    for answer in (REJECTED, OSLO, BERGEN):
        wire.reply(server, answer)
    assert agent.generate("Largest city?").output == City(**OSLO)
    assert agent.generate("And the second?").output == City(**BERGEN)
    bodies = [request.json for request in server.requests]
    for body in bodies:
        wire.check(body)
    correction = memory.load("c")[2]
    assert correction.role == MessageRole.SYSTEM and "population" in correction.text
    rejected, later = json.dumps(REJECTED), wire.later_system_role
    # The retry request ends with the correction, right after the rejected answer.
    assert wire.flat(bodies[1]) == [
        ("system", "Be brief."),
        ("user", "Largest city?"),
        ("assistant", rejected),
        (later, correction.text),
    ]
    # The next turn: the old correction where it was, not a standing instruction.
    assert wire.flat(bodies[2]) == [
        ("system", "Be brief."),
        ("user", "Largest city?"),
        ("assistant", rejected),
        (later, correction.text),
        ("assistant", json.dumps(OSLO)),
        ("user", "And the second?"),
    ]
    if wire.name == "anthropic":
        retry = bodies[1]
        assert retry["system"] == [{"type": "text", "text": "Be brief."}]
        assert retry["messages"][-1] == {
            "role": "user",
            "content": [{"type": "text", "text": correction.text}],
        }
        assert bodies[2]["system"] == [{"type": "text", "text": "Be brief."}]


@pytest.mark.parametrize("wire", WIRES, ids=lambda wire: wire.name)
async def test_mid_history_system_and_developer_messages_keep_their_place_on_each_wire(
    server: OpenAIServer, wire: Wire
) -> None:
    history = [
        Message.system("Be brief."),
        Message.user("Hi."),
        Message.assistant("Hello."),
        Message(role=MessageRole.DEVELOPER, content=[TextPart(text="Formal from now on.")]),
        Message.user("Weather?"),
        Message.system("The user switched to a phone."),
    ]
    wire.reply(server, {"ok": True})
    async with wire.model(server) as model:
        await model.request(ModelRequest(messages=history))
    (body,) = [request.json for request in server.requests]
    wire.check(body)
    later = {"anthropic": "user"}.get(wire.name)
    assert wire.flat(body) == [
        ("system", "Be brief."),
        ("user", "Hi."),
        ("assistant", "Hello."),
        (later or "developer", "Formal from now on."),
        ("user", "Weather?"),
        (later or "system", "The user switched to a phone."),
    ]


# -- sampling settings of the pinned version -----------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_temperature_and_top_p_arrive_as_the_pinned_version_takes_them(
    server: OpenAIServer, stream: bool
) -> None:
    assert API_VERSION == "2023-06-01"
    message = w.anthropic_message([w.text_block("ok")])
    if stream:
        server.reply_raw(w.sse(w.anthropic_events(message)), content_type="text/event-stream")
    else:
        server.reply_raw(message.model_dump_json())
    settings = ModelSettings(temperature=0.0, top_p=0.9, max_tokens=64, stop=["END"],
                             extra_body={"top_k": 40})  # fmt: skip
    request = ModelRequest(messages=[Message.user("hi")], settings=settings)
    async with claude(server) as model:
        if stream:
            deltas: list[str] = []

            async def on_delta(piece: str) -> None:
                deltas.append(piece)

            await model.request(request, on_text_delta=on_delta)
        else:
            await model.request(request)
    (body,) = checked(server)
    assert server.requests[0].headers["anthropic-version"] == API_VERSION
    fields = {k: v for k, v in body.items() if k not in ("model", "messages", "stream")}
    assert fields == {
        "max_tokens": 64,
        "temperature": 0.0,
        "top_p": 0.9,
        "top_k": 40,
        "stop_sequences": ["END"],
    }


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (ModelSettings(seed=3), r"anthropic-version 2023-06-01\) has no seed setting"),
        (ModelSettings(temperature=1.5), "takes a temperature from 0.0 to 1.0, not 1.5"),
    ],
)
async def test_what_the_pinned_version_does_not_take_is_refused_before_sending(
    server: OpenAIServer, settings: ModelSettings, expected: str
) -> None:
    request = ModelRequest(messages=[Message.user("hi")], settings=settings)
    async with claude(server) as model:
        with pytest.raises(ModelError, match=expected):
            await model.request(request)
    assert server.requests == []


def test_the_sdk_request_types_of_the_pinned_version_refuse_what_it_lacks() -> None:
    # The conformance check itself can fail: a seed or a mistyped temperature is caught.
    hello = {"role": "user", "content": [{"type": "text", "text": "x"}]}
    body: Json = {"model": "m", "max_tokens": 5, "temperature": 0.5, "top_p": 0.9,
                  "messages": [hello]}  # fmt: skip
    w.check_anthropic_body(body)
    with pytest.raises(AssertionError, match="seed is not defined"):
        w.check_anthropic_body({**body, "seed": 1})
    with pytest.raises(ValueError, match="temperature"):
        w.check_anthropic_body({**body, "temperature": "hot"})


async def test_the_body_is_what_the_official_sdk_sends_at_the_pinned_version(
    server: OpenAIServer,
) -> None:
    # The SDK at API_VERSION, its sampling fields given the way its migration guide says
    # (extra_body, merged into the body as they are): convoq's body for the same retry
    # request is the same JSON.

    retry = [
        Message.system("Be brief."),
        Message.user("City?"),
        Message.assistant('{"name": "Oslo"}'),
        Message.system("Add the population."),
    ]
    settings = ModelSettings(temperature=0.2, top_p=0.5, max_tokens=64, stop=["END"])
    for _ in range(2):
        server.reply_raw(w.anthropic_message([w.text_block("ok")]).model_dump_json())
    async with claude(server) as model:
        await model.request(ModelRequest(messages=retry, settings=settings))
    pinned = {"anthropic-version": API_VERSION}  # the SDK's own default is a later version
    base = server.url.removesuffix("/v1")
    client = sdk.AsyncAnthropic(base_url=base, api_key="k", max_retries=0, default_headers=pinned)
    async with client:
        await client.messages.create(
            model="claude-x",
            max_tokens=64,
            stop_sequences=["END"],
            system=[{"type": "text", "text": "Be brief."}],
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "City?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": '{"name": "Oslo"}'}]},
                {"role": "user", "content": [{"type": "text", "text": "Add the population."}]},
            ],
            extra_body={"temperature": 0.2, "top_p": 0.5},
        )
    ours, theirs = checked(server)
    assert ours == theirs
    assert [r.headers["anthropic-version"] for r in server.requests] == [API_VERSION] * 2

"""The Anthropic Messages model against a loopback server replaying what the API sends.

Every request body the model sends is checked against the anthropic SDK's request types;
every answer and stream event is built from the SDK's response types."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import ErrorResponse, RawMessageStreamEvent

from convoq.errors import ModelError, ModelHTTPError, ModelTimeoutError, TruncatedAnswerError
from convoq.messages import FilePart, ImagePart, Message, MessageRole, TextPart, ToolCall
from convoq.models import (
    AnthropicModel,
    Model,
    ModelRequest,
    ModelSettings,
    OutputSpec,
    ToolSpec,
    anthropic,
)
from convoq.models._anthropic_read import HANDLED_EVENTS
from convoq.models.anthropic import API_VERSION
from convoq.usage import Usage
from tests.support import sdk_wire as w
from tests.support.openai_server import OpenAIServer

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
PDF = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj<<>>endobj\n%%EOF\n"
RECORDED = Path(__file__).parents[1] / "fixtures" / "anthropic_stream.sse"
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = ToolSpec(name="get_weather", description="Weather for a city.", parameters=CITY)


def base(server: OpenAIServer) -> str:
    return server.url.removesuffix("/v1")  # the SDK's base URL has no /v1


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as running:
        yield running
        for request in running.requests:  # everything sent is a valid SDK request
            w.check_anthropic_body(request.json)


@pytest.fixture
async def model(server: OpenAIServer) -> AsyncIterator[AnthropicModel]:
    claude = anthropic("claude-x", base_url=base(server), api_key="sk-ant", retry_base_delay=0)
    yield claude
    await claude.aclose()


def ask(text: str = "hello", **fields: Any) -> ModelRequest:
    return ModelRequest(messages=[Message.user(text)], **fields)


def answer_json(server: OpenAIServer, *content: dict[str, Any], **kwargs: Any) -> None:
    server.reply_raw(w.anthropic_message(content, **kwargs).model_dump_json())


def answer_stream(server: OpenAIServer, *content: dict[str, Any], **kwargs: Any) -> None:
    events = w.anthropic_events(w.anthropic_message(content, **kwargs))
    server.reply_raw(w.sse(events), content_type="text/event-stream")


async def streamed(model: Model, request: ModelRequest) -> tuple[Message, list[str]]:
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    return await model.request(request, on_text_delta=on_delta), deltas


async def test_text_round_trip(server: OpenAIServer, model: AnthropicModel) -> None:
    answer_json(server, w.text_block("Hi there."))
    answer = await model.request(ask())
    assert isinstance(model, Model)
    assert (answer.role, answer.text, answer.finish_reason) == ("assistant", "Hi there.", "stop")
    # Anthropic's input_tokens leave the cache out; convoq's prompt tokens count it.
    assert answer.usage == Usage(
        requests=1, prompt_tokens=130, completion_tokens=9, total_tokens=139, cached_tokens=100
    )
    sent = server.requests[0]
    assert sent.path == "/v1/messages"
    assert (sent.headers["x-api-key"], sent.headers["anthropic-version"]) == ("sk-ant", API_VERSION)
    assert "authorization" not in sent.headers
    hello = {"role": "user", "content": [{"type": "text", "text": "hello"}]}
    assert sent.json == {"model": "claude-x", "max_tokens": 4096, "messages": [hello]}


async def test_a_bearer_token_and_the_environment(
    server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "tok-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", base(server))
    answer_json(server, w.text_block("ok"))
    async with anthropic("claude-x") as claude:
        await claude.request(ask())
    assert server.requests[0].headers["authorization"] == "Bearer tok-env"
    assert "x-api-key" not in server.requests[0].headers
    monkeypatch.setenv("ANTHROPIC_API_KEY", "key-env")
    answer_json(server, w.text_block("ok"))
    async with anthropic("claude-x", auth_token="") as claude:
        await claude.request(ask())
    assert server.requests[1].headers["x-api-key"] == "key-env"
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN")
    monkeypatch.delenv("ANTHROPIC_BASE_URL")
    with pytest.raises(ModelError, match="ANTHROPIC_API_KEY"):
        await anthropic("claude-x").request(ask())


async def test_history_on_the_wire(server: OpenAIServer, model: AnthropicModel) -> None:
    one = ToolCall(id="toolu_1", name="get_weather", arguments={"city": "Oslo"})
    two = ToolCall(id="toolu_2", name="get_weather", arguments={"city": "Rome"})
    user = Message(
        content=[
            TextPart(text="What is in these?"),
            TextPart(text=""),
            ImagePart(data=PNG, mime_type="image/png"),
            FilePart(data=PDF, mime_type="application/pdf", filename="report.pdf"),
            FilePart(data=b"plain notes", mime_type="text/plain"),
        ]
    )
    history = [
        Message.system("Be brief."),
        Message(role=MessageRole.DEVELOPER, content=[TextPart(text="Use tools.")]),
        user,
        Message.assistant("Looking.", [one, two]),
        Message.tool_result(one, "sunny"),
        Message.tool_result(two, "rain"),
        Message.user("thanks"),
    ]
    answer_json(server, w.text_block("ok"))
    await model.request(ModelRequest(messages=history, tools=[WEATHER]))
    body = server.requests[0].json
    assert body["system"] == [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": "Use tools."},
    ]
    png, pdf = base64.b64encode(PNG).decode(), base64.b64encode(PDF).decode()
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in these?"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": png},
                },
                {
                    "type": "document",
                    "title": "report.pdf",
                    "source": {"type": "base64", "media_type": "application/pdf", "data": pdf},
                },
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": "plain notes"},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "get_weather",
                    "input": {"city": "Rome"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "rain"},
                {"type": "text", "text": "thanks"},
            ],
        },
    ]
    assert body["tools"] == [
        {"name": "get_weather", "description": "Weather for a city.", "input_schema": CITY}
    ]


@pytest.mark.parametrize(
    ("part", "expected"),
    [
        (ImagePart(data=b"BM..", mime_type="image/bmp"), "image/bmp"),
        (FilePart(data=b"PK", mime_type="application/zip", filename="a.zip"), "a.zip"),
    ],
)
async def test_attachments_the_api_cannot_take_are_refused_before_sending(
    server: OpenAIServer, model: AnthropicModel, part: ImagePart | FilePart, expected: str
) -> None:
    with pytest.raises(ModelError, match=expected):
        await model.request(ModelRequest(messages=[Message(content=[part])]))
    assert server.requests == []


@pytest.mark.parametrize("stream", [False, True])
async def test_parallel_tool_calls(
    server: OpenAIServer, model: AnthropicModel, stream: bool
) -> None:
    blocks = (
        w.text_block("Checking both."),
        w.tool_use_block("toolu_a", "get_weather", {"city": "Oslo"}),
        w.tool_use_block("toolu_b", "get_weather", {"city": "Rome"}),
    )
    (answer_stream if stream else answer_json)(server, *blocks, stop_reason="tool_use")
    answer = (await streamed(model, ask()))[0] if stream else await model.request(ask())
    assert answer.text == "Checking both."
    assert answer.tool_calls == [
        ToolCall(id="toolu_a", name="get_weather", arguments={"city": "Oslo"}),
        ToolCall(id="toolu_b", name="get_weather", arguments={"city": "Rome"}),
    ]
    assert answer.finish_reason == "tool_calls"


async def test_streamed_text_arrives_in_deltas(server: OpenAIServer, model: AnthropicModel) -> None:
    answer_stream(server, w.text_block("Hello, world!"))
    answer, deltas = await streamed(model, ask())
    assert deltas == ["Hell", "o, w", "orld", "!"]
    assert (answer.text, answer.finish_reason) == ("Hello, world!", "stop")
    assert answer.usage is not None and answer.usage.cached_tokens == 100
    assert server.requests[0].json["stream"] is True


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("stop_reason", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("pause_turn", "stop"),
    ],
)
async def test_stop_reasons_map_to_finish_reasons(
    server: OpenAIServer, model: AnthropicModel, stream: bool, stop_reason: str, finish: str
) -> None:
    (answer_stream if stream else answer_json)(server, w.text_block("Hi"), stop_reason=stop_reason)
    answer = (await streamed(model, ask()))[0] if stream else await model.request(ask())
    assert (answer.text, answer.finish_reason) == ("Hi", finish)


async def test_cut_off_before_any_text_is_a_truncated_answer(
    server: OpenAIServer, model: AnthropicModel
) -> None:
    answer_json(server, stop_reason="max_tokens")
    with pytest.raises(TruncatedAnswerError, match=r"ModelSettings\(max_tokens"):
        await model.request(ask())


@pytest.mark.parametrize("stream", [False, True])
async def test_a_refusal_is_a_refusal(
    server: OpenAIServer, model: AnthropicModel, stream: bool
) -> None:
    (answer_stream if stream else answer_json)(server, w.text_block("I can"), stop_reason="refusal")
    (answer_stream if stream else answer_json)(server, stop_reason="refusal")
    first = (await streamed(model, ask()))[0] if stream else await model.request(ask())
    second = (await streamed(model, ask()))[0] if stream else await model.request(ask())
    assert (first.refusal, first.text, first.finish_reason) == ("I can", "", "content_filter")
    assert second.refusal == "the model declined to answer (stop_reason 'refusal')"


def test_handled_events_are_events_of_the_sdk() -> None:
    error_type = ErrorResponse.model_fields["type"].annotation
    known = set(w.event_classes(RawMessageStreamEvent)) | {error_type.__args__[0]}
    assert set(HANDLED_EVENTS) <= known


async def test_unknown_and_unhandled_events_are_ignored(
    server: OpenAIServer, model: AnthropicModel
) -> None:
    events: list[Any] = list(w.anthropic_events(w.anthropic_message([w.text_block("Hi")])))
    noise = [
        {"type": "ping"},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "citations_delta", "citation": {"type": "char_location"}},
        },
        {"type": "content_block_delta", "index": 0, "delta": {"type": "future_delta"}},
        {"type": "message_from_the_future", "payload": [1, 2]},
    ]
    server.reply_raw(w.sse([*events[:2], *noise, *events[2:]]), content_type="text/event-stream")
    answer, deltas = await streamed(model, ask())
    assert (answer.text, deltas) == ("Hi", ["Hi"])


def error_event(kind: str, message: str) -> ErrorResponse:
    return ErrorResponse.model_validate(
        {"type": "error", "error": {"type": kind, "message": message}}
    )


async def test_stream_errors(server: OpenAIServer, model: AnthropicModel) -> None:
    events = w.anthropic_events(w.anthropic_message([w.text_block("Hello")]))
    bad = error_event("invalid_request_error", "no such thing")
    server.reply_raw(w.sse([events[0], bad]), content_type="text/event-stream")
    server.reply_raw(w.sse(events[:-1]), content_type="text/event-stream")
    with pytest.raises(ModelError, match="no such thing") as caught:
        await streamed(model, ask())
    assert not isinstance(caught.value, ModelHTTPError)
    with pytest.raises(ModelError, match="ended before message_stop"):
        await streamed(model, ask())


async def test_a_recorded_stream_replays(server: OpenAIServer, model: AnthropicModel) -> None:
    recorded = RECORDED.read_text()
    for line in recorded.splitlines():
        data = json.loads(line[6:]) if line.startswith("data: ") else None
        if data and data["type"] in w.ANTHROPIC_EVENTS:
            w.ANTHROPIC_EVENTS[data["type"]].model_validate(data)  # the recording is SDK-shaped
    server.reply_raw(recorded, content_type="text/event-stream")
    answer, deltas = await streamed(model, ask(tools=[WEATHER]))
    assert "".join(deltas) == answer.text == "I'll check the weather in Oslo."
    call = ToolCall(id="toolu_01T1x", name="get_weather", arguments={"city": "Oslo"})
    assert (answer.tool_calls, answer.finish_reason) == ([call], "tool_calls")
    assert answer.usage == Usage(
        requests=1, prompt_tokens=472, completion_tokens=89, total_tokens=561, cached_tokens=0
    )


async def test_overloaded_529_is_retried_as_told(server: OpenAIServer) -> None:
    async with anthropic("claude-x", base_url=base(server), api_key="k", retry_base_delay=0) as c:
        server.reply_status(529, headers={"retry-after": "0"}, message="Overloaded")
        answer_json(server, w.text_block("finally"))
        assert (await c.request(ask())).text == "finally"
        server.reply_status(529, headers={"x-should-retry": "false"}, message="Overloaded")
        with pytest.raises(ModelHTTPError) as caught:
            await c.request(ask())
    assert caught.value.status_code == 529
    assert len(server.requests) == 3


async def test_settings_on_the_wire(server: OpenAIServer, model: AnthropicModel) -> None:
    settings = ModelSettings(
        max_tokens=200,
        temperature=0.3,
        top_p=0.8,
        stop=["END"],
        tool_choice="required",
        parallel_tool_calls=False,
        extra_body={"metadata": {"user_id": "u-1"}},
    )
    answer_json(
        server, w.tool_use_block("toolu_1", "get_weather", {"city": "Oslo"}), stop_reason="tool_use"
    )
    await model.request(ask(tools=[WEATHER], settings=settings))
    body = server.requests[0].json
    assert {k: v for k, v in body.items() if k not in ("model", "messages", "tools")} == {
        "max_tokens": 200,
        "temperature": 0.3,
        "top_p": 0.8,
        "stop_sequences": ["END"],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "metadata": {"user_id": "u-1"},
    }


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (ModelSettings(seed=3), "no seed setting"),
        (ModelSettings(temperature=1.2, top_p=0.9), "temperature from 0.0 to 1.0"),
    ],
)
async def test_settings_the_api_cannot_take_are_refused_before_sending(
    server: OpenAIServer, model: AnthropicModel, settings: ModelSettings, expected: str
) -> None:
    with pytest.raises(ModelError, match=expected):
        await model.request(ask(settings=settings))
    assert server.requests == []


@pytest.mark.parametrize("stream", [False, True])
async def test_typed_output_through_the_output_tool(
    server: OpenAIServer, model: AnthropicModel, stream: bool
) -> None:
    output = OutputSpec(name="City", json_schema=CITY)
    reply = answer_stream if stream else answer_json
    reply(server, w.tool_use_block("toolu_1", "City", {"city": "Oslo"}), stop_reason="tool_use")
    answer, deltas = (
        await streamed(model, ask(output=output))
        if stream
        else (await model.request(ask(output=output)), None)
    )
    assert (answer.text, answer.tool_calls, answer.finish_reason) == (
        '{"city": "Oslo"}',
        [],
        "stop",
    )
    if stream:
        assert deltas == ['{"city": "Oslo"}']
    body = server.requests[0].json
    assert body["tools"][-1]["name"] == "City" and body["tools"][-1]["input_schema"] == CITY
    assert body["tool_choice"] == {"type": "tool", "name": "City"}


async def test_typed_output_beside_other_tools(server: OpenAIServer, model: AnthropicModel) -> None:
    output = OutputSpec(name="City", json_schema=CITY)
    answer_json(
        server,
        w.tool_use_block("toolu_1", "get_weather", {"city": "Oslo"}),
        w.tool_use_block("toolu_2", "City", {"city": "?"}),
        stop_reason="tool_use",
    )
    answer = await model.request(ask(tools=[WEATHER], output=output))
    # The model must call a tool; a real tool runs first, the early answer is dropped.
    assert [c.name for c in answer.tool_calls] == ["get_weather"]
    assert server.requests[0].json["tool_choice"] == {"type": "any"}
    clash = OutputSpec(name="get_weather", json_schema=CITY)
    with pytest.raises(ModelError, match="also a tool's name"):
        await model.request(ask(tools=[WEATHER], output=clash))


async def test_typed_output_natively(server: OpenAIServer) -> None:
    output = OutputSpec(name="City", json_schema=CITY)
    async with anthropic(
        "claude-x", base_url=base(server), api_key="k", output_mode="native"
    ) as claude:
        answer_json(server, w.text_block('{"city": "Oslo"}'))
        answer = await claude.request(ask(output=output))
    assert answer.text == '{"city": "Oslo"}'
    body = server.requests[0].json
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": CITY}}
    assert "tools" not in body and "tool_choice" not in body


def test_bad_options_are_refused() -> None:
    with pytest.raises(ModelError, match="output_mode"):
        anthropic("claude-x", api_key="k", output_mode="json")  # type: ignore[arg-type]
    with pytest.raises(ModelError, match="max_tokens"):
        anthropic("claude-x", api_key="k", max_tokens=0)


async def test_thinking_tokens_count_as_reasoning(
    server: OpenAIServer, model: AnthropicModel
) -> None:
    usage = {
        "input_tokens": 10,
        "output_tokens": 50,
        "output_tokens_details": {"thinking_tokens": 40},
    }
    answer_json(server, w.text_block("42"), usage=usage)
    answer = await model.request(ask())
    assert answer.usage == Usage(
        requests=1, prompt_tokens=10, completion_tokens=50, total_tokens=60, reasoning_tokens=40
    )


async def test_overloaded_in_the_stream_is_retried_until_text_went_out(
    server: OpenAIServer, model: AnthropicModel
) -> None:
    events = w.anthropic_events(w.anthropic_message([w.text_block("Hello there")]))
    overloaded = error_event("overloaded_error", "Overloaded")
    server.reply_raw(w.sse([events[0], overloaded]), content_type="text/event-stream")
    server.reply_raw(w.sse(events), content_type="text/event-stream")
    answer, deltas = await streamed(model, ask())
    assert (answer.text, "".join(deltas), len(server.requests)) == ("Hello there", "Hello there", 2)
    # Once text was handed out, a retry would repeat it: the error ends the call.
    server.reply_raw(w.sse([*events[:3], overloaded]), content_type="text/event-stream")
    with pytest.raises(ModelHTTPError, match="Overloaded") as caught:
        await streamed(model, ask())
    assert caught.value.status_code == 529
    assert len(server.requests) == 3


async def test_keep_alive_comments_do_not_stretch_the_attempt_deadline(
    server: OpenAIServer,
) -> None:
    server.reply_keepalive(every=0.2)
    claude = anthropic(
        "claude-x", base_url=base(server), api_key="k", attempt_timeout=1.0, max_retries=0
    )
    async with claude:
        with pytest.raises(ModelTimeoutError, match="attempt_timeout=1 s"):
            await streamed(claude, ask())

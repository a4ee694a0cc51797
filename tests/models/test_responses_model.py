"""The OpenAI Responses model against a loopback server replaying what the API sends.

Every request body the model sends is checked against the openai SDK's request types;
every answer and stream event is built from the SDK's response types."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import ResponseStreamEvent

from convoq.errors import ModelError, ModelHTTPError, ModelTimeoutError, TruncatedAnswerError
from convoq.messages import FilePart, ImagePart, Message, MessageRole, TextPart, ToolCall
from convoq.models import (
    Model,
    ModelRequest,
    ModelSettings,
    OpenAIResponsesModel,
    OutputSpec,
    ToolSpec,
    responses,
)
from convoq.models._responses_wire import HANDLED_EVENTS
from convoq.models._wire_common import is_strict_schema
from convoq.usage import Usage
from tests.support import sdk_wire as w
from tests.support.openai_server import OpenAIServer

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
PDF = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj<<>>endobj\n%%EOF\n"
RECORDED = Path(__file__).parents[1] / "fixtures" / "responses_stream.sse"
STRICT = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
LOOSE = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
WEATHER = ToolSpec(name="get_weather", description="Weather for a city.", parameters=STRICT)


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as running:
        yield running
        for request in running.requests:  # everything sent is a valid SDK request
            w.check_responses_body(request.json)


@pytest.fixture
async def model(server: OpenAIServer) -> AsyncIterator[OpenAIResponsesModel]:
    chat = responses("gpt-x", base_url=server.url, api_key="sk-test", retry_base_delay=0)
    yield chat
    await chat.aclose()


def ask(text: str = "hello", **fields: Any) -> ModelRequest:
    return ModelRequest(messages=[Message.user(text)], **fields)


def answer_json(server: OpenAIServer, *output: dict[str, Any], **kwargs: Any) -> None:
    server.reply_raw(w.response(output, **kwargs).model_dump_json())


def answer_stream(server: OpenAIServer, *output: dict[str, Any], **kwargs: Any) -> None:
    events = w.responses_events(w.response(output, **kwargs))
    server.reply_raw(w.sse(events), content_type="text/event-stream")


async def streamed(model: Model, request: ModelRequest) -> tuple[Message, list[str]]:
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    return await model.request(request, on_text_delta=on_delta), deltas


async def test_text_round_trip(server: OpenAIServer, model: OpenAIResponsesModel) -> None:
    answer_json(server, w.reasoning_item(), w.text_item("Hi there."))
    answer = await model.request(ask())
    assert isinstance(model, Model)
    assert (answer.role, answer.text, answer.finish_reason) == (
        MessageRole.ASSISTANT,
        "Hi there.",
        "stop",
    )
    assert answer.usage == Usage(
        requests=1,
        prompt_tokens=40,
        completion_tokens=12,
        total_tokens=52,
        cached_tokens=30,
        reasoning_tokens=8,
    )
    sent = server.requests[0]
    assert (sent.path, sent.headers["authorization"]) == ("/v1/responses", "Bearer sk-test")
    said = {"type": "message", "role": "user", "content": "hello"}
    assert sent.json == {"model": "gpt-x", "store": False, "input": [said]}


async def test_history_instructions_attachments_and_tools_on_the_wire(
    server: OpenAIServer, model: OpenAIResponsesModel
) -> None:
    call = ToolCall(id="call_7", name="get_weather", arguments={"city": "Oslo"})
    user = Message(
        content=[
            TextPart(text="What is in these?"),
            ImagePart(data=PNG, mime_type="image/png", provider_options={"detail": "low"}),
            FilePart(data=PDF, mime_type="application/pdf", filename="report.pdf"),
        ]
    )
    history = [
        Message.system("Be brief."),
        Message(role=MessageRole.DEVELOPER, content=[TextPart(text="Use tools.")]),
        user,
        Message.assistant("Looking.", [call]),
        Message.tool_result(call, "sunny"),
        Message.assistant("It is sunny."),
        Message.user("thanks"),
    ]
    answer_json(server, w.text_item("ok"))
    await model.request(ModelRequest(messages=history, tools=[WEATHER]))
    body = server.requests[0].json
    png = "data:image/png;base64," + base64.b64encode(PNG).decode()
    pdf = "data:application/pdf;base64," + base64.b64encode(PDF).decode()
    assert body["input"] == [
        {"type": "message", "role": "system", "content": "Be brief."},
        {"type": "message", "role": "developer", "content": "Use tools."},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is in these?"},
                {"type": "input_image", "image_url": png, "detail": "low"},
                {"type": "input_file", "file_data": pdf, "filename": "report.pdf"},
            ],
        },
        {"type": "message", "role": "assistant", "content": "Looking."},
        {
            "type": "function_call",
            "call_id": "call_7",
            "name": "get_weather",
            "arguments": '{"city": "Oslo"}',
        },
        {"type": "function_call_output", "call_id": "call_7", "output": "sunny"},
        {"type": "message", "role": "assistant", "content": "It is sunny."},
        {"type": "message", "role": "user", "content": "thanks"},
    ]
    tool = {"type": "function", "name": "get_weather", "strict": True, "parameters": STRICT}
    assert body["tools"] == [tool | {"description": "Weather for a city."}]


@pytest.mark.parametrize(
    ("strict_tools", "schema", "sent"),
    [(None, STRICT, True), (None, LOOSE, False), (False, STRICT, False), (True, LOOSE, True)],
)
async def test_strict_is_always_sent_and_true_only_where_the_schema_qualifies(
    server: OpenAIServer, strict_tools: bool | None, schema: dict[str, Any], sent: bool
) -> None:
    tool = ToolSpec(name="f", parameters=schema)
    async with responses("gpt-x", base_url=server.url, strict_tools=strict_tools) as chat:
        answer_json(server, w.text_item("ok"))
        await chat.request(ask(tools=[tool]))
    assert server.requests[0].json["tools"][0]["strict"] is sent


@pytest.mark.parametrize("stream", [False, True])
async def test_parallel_tool_calls(
    server: OpenAIServer, model: OpenAIResponsesModel, stream: bool
) -> None:
    items = (
        w.reasoning_item(),
        w.call_item("c1", "get_weather", {"city": "Oslo"}),
        w.call_item("c2", "get_weather", {"city": "Rome"}),
    )
    (answer_stream if stream else answer_json)(server, *items)
    answer = (await streamed(model, ask()))[0] if stream else await model.request(ask())
    assert answer.tool_calls == [
        ToolCall(id="c1", name="get_weather", arguments={"city": "Oslo"}),
        ToolCall(id="c2", name="get_weather", arguments={"city": "Rome"}),
    ]
    assert answer.finish_reason == "tool_calls"


async def test_streamed_text_arrives_in_deltas(
    server: OpenAIServer, model: OpenAIResponsesModel
) -> None:
    answer_stream(server, w.text_item("Hello, world!"))
    answer, deltas = await streamed(model, ask())
    assert deltas == ["Hell", "o, w", "orld", "!"]
    assert (answer.text, answer.finish_reason, answer.usage and answer.usage.cached_tokens) == (
        "Hello, world!",
        "stop",
        30,
    )
    sent = server.requests[0]
    assert sent.json["stream"] is True and sent.headers["accept"] == "text/event-stream"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_refusal_is_kept_apart(
    server: OpenAIServer, model: OpenAIResponsesModel, stream: bool
) -> None:
    (answer_stream if stream else answer_json)(server, w.refusal_item("I can't help."))
    answer = (await streamed(model, ask()))[0] if stream else await model.request(ask())
    assert (answer.refusal, answer.text) == ("I can't help.", "")
    # Sent back later as what the assistant said.
    answer_json(server, w.text_item("ok"))
    await model.request(ModelRequest(messages=[Message.user("x"), answer, Message.user("y")]))
    assert server.requests[1].json["input"][1] == {
        "type": "message",
        "role": "assistant",
        "content": "I can't help.",
    }


@pytest.mark.parametrize("stream", [False, True])
async def test_incomplete_answers_map_to_finish_reasons(
    server: OpenAIServer, model: OpenAIResponsesModel, stream: bool
) -> None:
    reply = answer_stream if stream else answer_json
    reply(server, w.text_item("Once upon"), status="incomplete", incomplete="max_output_tokens")
    reply(server, w.text_item("Half"), status="incomplete", incomplete="content_filter")
    reply(server, status="incomplete", incomplete="max_output_tokens")
    ask_it = (lambda: streamed(model, ask())) if stream else None
    for text, reason in (("Once upon", "length"), ("Half", "content_filter")):
        answer = (await ask_it())[0] if ask_it else await model.request(ask())
        assert (answer.text, answer.finish_reason) == (text, reason)
    with pytest.raises(TruncatedAnswerError, match=r"ModelSettings\(max_tokens"):
        await (ask_it() if ask_it else model.request(ask()))


async def test_a_failed_response_is_a_model_error(
    server: OpenAIServer, model: OpenAIResponsesModel
) -> None:
    error = {"code": "server_error", "message": "the model broke"}
    answer_stream(server, status="failed", error=error)
    with pytest.raises(ModelError, match="the model broke"):
        await streamed(model, ask())
    server.reply_raw(
        w.sse(
            [
                {
                    "type": "error",
                    "code": "rate_limit",
                    "message": "slow down",
                    "param": None,
                    "sequence_number": 0,
                }
            ]
        ),
        content_type="text/event-stream",
    )
    with pytest.raises(ModelError, match="slow down"):
        await streamed(model, ask())


def sdk_event_types() -> list[str]:
    return list(w.event_classes(ResponseStreamEvent))


def test_handled_events_are_events_of_the_sdk() -> None:
    assert set(HANDLED_EVENTS) <= set(sdk_event_types())


async def test_unknown_and_unhandled_events_are_ignored(
    server: OpenAIServer, model: OpenAIResponsesModel
) -> None:
    events: list[Any] = list(w.responses_events(w.response([w.text_item("Hi")])))
    others = [t for t in sdk_event_types() if t not in HANDLED_EVENTS]
    noise = [{"type": t, "sequence_number": 0, "item_id": "x", "output_index": 5} for t in others]
    noise.append({"type": "response.from_the_future", "payload": {"x": 1}})
    server.reply_raw(w.sse([events[0], *noise, *events[1:]]), content_type="text/event-stream")
    answer, deltas = await streamed(model, ask())
    assert (answer.text, deltas) == ("Hi", ["Hi"])


async def test_a_stream_cut_before_its_final_event_is_an_error(
    server: OpenAIServer, model: OpenAIResponsesModel
) -> None:
    events = w.responses_events(w.response([w.text_item("Hello")]))
    server.reply_raw(w.sse(events[:-1]), content_type="text/event-stream")
    with pytest.raises(ModelError, match=r"ended before response\.completed"):
        await streamed(model, ask())


async def test_a_recorded_stream_replays(server: OpenAIServer, model: OpenAIResponsesModel) -> None:
    recorded = RECORDED.read_text()
    for line in recorded.splitlines():
        if line.startswith("data: "):
            w.responses_event(line[6:])  # the recording is SDK-shaped
    server.reply_raw(recorded, content_type="text/event-stream")
    answer, deltas = await streamed(model, ask(tools=[WEATHER]))
    assert "".join(deltas) == answer.text == "Let me check."
    assert answer.tool_calls == [
        ToolCall(id="call_Q1", name="get_weather", arguments={"city": "Oslo"})
    ]
    assert answer.usage is not None and answer.usage.reasoning_tokens == 64


async def test_settings_and_typed_output_on_the_wire(
    server: OpenAIServer, model: OpenAIResponsesModel
) -> None:
    settings = ModelSettings(
        temperature=0.2,
        top_p=0.9,
        max_tokens=300,
        tool_choice="get_weather",
        parallel_tool_calls=False,
        extra_body={"user": "u-1"},
    )
    output = OutputSpec(name="City", json_schema=STRICT)
    answer_json(server, w.text_item('{"city": "Oslo"}'))
    answer = await model.request(ask(tools=[WEATHER], settings=settings, output=output))
    assert answer.text == '{"city": "Oslo"}'
    body = server.requests[0].json
    assert {
        k: body[k]
        for k in (
            "temperature",
            "top_p",
            "max_output_tokens",
            "tool_choice",
            "parallel_tool_calls",
            "user",
            "text",
        )
    } == {
        "temperature": 0.2,
        "top_p": 0.9,
        "max_output_tokens": 300,
        "tool_choice": {"type": "function", "name": "get_weather"},
        "parallel_tool_calls": False,
        "user": "u-1",
        "text": {
            "format": {"type": "json_schema", "name": "City", "schema": STRICT, "strict": True}
        },
    }


@pytest.mark.parametrize("setting", [{"seed": 1}, {"stop": ["END"]}])
async def test_settings_the_api_lacks_are_refused_before_sending(
    server: OpenAIServer, model: OpenAIResponsesModel, setting: dict[str, Any]
) -> None:
    with pytest.raises(ModelError, match=f"no {next(iter(setting))} setting"):
        await model.request(ask(settings=ModelSettings(**setting)))
    assert server.requests == []


async def test_retries_follow_retry_after_and_x_should_retry(server: OpenAIServer) -> None:
    async with responses("gpt-x", base_url=server.url, retry_base_delay=0) as chat:
        server.reply_status(429, headers={"Retry-After": "0"})
        server.reply_status(400, headers={"x-should-retry": "true"})
        answer_json(server, w.text_item("finally"))
        assert (await chat.request(ask())).text == "finally"
        server.reply_status(503, headers={"x-should-retry": "false"}, message="not again")
        with pytest.raises(ModelHTTPError, match="not again"):
            await chat.request(ask())
    assert len(server.requests) == 4


async def test_key_and_base_url_from_the_environment(
    server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    answer_json(server, w.text_item("ok"))
    async with responses("gpt-x") as chat:
        await chat.request(ask())
    assert server.requests[0].headers["authorization"] == "Bearer sk-env"
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("OPENAI_BASE_URL")
    with pytest.raises(ModelError, match="OPENAI_API_KEY"):
        await responses("gpt-x").request(ask())


async def test_an_attachment_outside_a_user_message_is_refused(
    server: OpenAIServer, model: OpenAIResponsesModel
) -> None:
    system = Message(role=MessageRole.SYSTEM, content=[ImagePart(data=PNG, mime_type="image/png")])
    with pytest.raises(ModelError, match="put attachments in a user message"):
        await model.request(ModelRequest(messages=[system, Message.user("hi")]))
    assert server.requests == []


async def test_nonsense_answers_are_model_errors(
    server: OpenAIServer, model: OpenAIResponsesModel
) -> None:
    server.reply_raw("<html>")
    server.reply_raw(json.dumps({"output": "x", "status": "completed"}))
    server.reply_raw(json.dumps({"output": [w.call_item("c", "f", "{oops")]}))
    for expected in ("not JSON", "output is not a list", "not a JSON object"):
        with pytest.raises(ModelError, match=expected):
            await model.request(ask())


NESTED_OPEN = {
    "type": "object",
    "additionalProperties": False,
    "required": ["where"],
    "properties": {
        "where": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        }
    },
}


@pytest.mark.parametrize(
    ("schema", "strict"),
    [
        (STRICT, True),
        (LOOSE, False),
        (NESTED_OPEN, False),
        ({**NESTED_OPEN, "properties": {"where": STRICT}}, True),
        (
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["xs"],
                "properties": {"xs": {"type": "array", "items": LOOSE}},
            },
            False,
        ),
    ],
)
def test_strict_needs_every_object_closed_and_fully_required_all_the_way_down(
    schema: dict[str, Any], strict: bool
) -> None:
    assert is_strict_schema(schema) is strict


SSE_CASES = {
    "comments, ids and retry fields are skipped": (": keep-alive\nid: 7\nretry: 100\n", None),
    "a line that is no known field is ignored, as the SSE standard says": ("<html>\n", None),
    "data that is not JSON": ("data: {oops\n\n", "not JSON"),
    "data that is not an object": ("data: [1]\n\n", "not a JSON object"),
}


@pytest.mark.parametrize("case", sorted(SSE_CASES))
async def test_event_stream_framing(
    server: OpenAIServer, model: OpenAIResponsesModel, case: str
) -> None:
    noise, error = SSE_CASES[case]
    events = w.responses_events(w.response([w.text_item("Hi")]))
    # One event's data split over two data: lines is joined back with a newline.
    first = w.sse(events[:1]).replace('{"response"', '{\ndata: "response"', 1)
    server.reply_raw(first + noise + w.sse(events[1:]), content_type="text/event-stream")
    if error is None:
        assert (await streamed(model, ask()))[0].text == "Hi"
    else:
        with pytest.raises(ModelError, match=error):
            await streamed(model, ask())


async def test_keep_alive_comments_do_not_stretch_the_attempt_deadline(
    server: OpenAIServer,
) -> None:
    server.reply_keepalive(every=0.2)
    chat = responses("gpt-x", base_url=server.url, attempt_timeout=1.0, max_retries=0)
    async with chat:
        with pytest.raises(ModelTimeoutError, match="attempt_timeout=1 s"):
            await streamed(chat, ask())


async def test_an_image_without_options_and_a_nameless_pdf(
    server: OpenAIServer, model: OpenAIResponsesModel
) -> None:
    user = Message(
        content=[
            ImagePart(data=PNG, mime_type="image/png"),
            FilePart(data=PDF, mime_type="application/pdf"),
        ]
    )
    answer_json(server, w.text_item("ok"))
    await model.request(ModelRequest(messages=[user]))
    image, pdf = server.requests[0].json["input"][0]["content"]
    assert (image["detail"], pdf["filename"]) == ("auto", "attachment.pdf")

"""OpenAIChatModel against a real Chat Completions server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from convoq._ports import free_loopback_port
from convoq.errors import ModelError, ModelHTTPError
from convoq.messages import FilePart, ImagePart, Message, MessageRole, TextPart, ToolCall
from convoq.models import Model, ModelRequest, OpenAIChatModel, ToolSpec, openai
from convoq.models._http_attempt import retry_after
from convoq.models._openai_wire import StreamAssembler
from tests.support.openai_server import OpenAIServer, tool_call_chunk

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
PDF = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj<<>>endobj\n%%EOF\n"
WEATHER = ToolSpec(
    name="get_weather",
    description="Weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as running:
        yield running


@pytest.fixture
async def model(server: OpenAIServer) -> AsyncIterator[OpenAIChatModel]:
    chat = openai("gpt-x", base_url=server.url, api_key="sk-test", retry_base_delay=0)
    yield chat
    await chat.aclose()


def ask(text: str = "hello", tools: list[ToolSpec] | None = None) -> ModelRequest:
    return ModelRequest(messages=[Message.user(text)], tools=tools or [])


def only_body(server: OpenAIServer) -> dict[str, Any]:
    assert len(server.requests) == 1
    body = server.requests[0].json
    assert isinstance(body, dict)
    return body


async def test_text_round_trip(server: OpenAIServer, model: OpenAIChatModel) -> None:
    server.reply_text("Hi there.")
    answer = await model.request(ask())
    assert isinstance(model, Model)
    assert answer.role == MessageRole.ASSISTANT
    assert answer.text == "Hi there."
    assert answer.tool_calls == []
    recorded = server.requests[0]
    assert (recorded.method, recorded.path) == ("POST", "/v1/chat/completions")
    assert only_body(server) == {
        "model": "gpt-x",
        "messages": [{"role": "user", "content": "hello"}],
    }


async def test_request_body_shape(server: OpenAIServer, model: OpenAIChatModel) -> None:
    call = ToolCall(id="call_7", name="get_weather", arguments={"city": "Oslo"})
    user = Message(
        role=MessageRole.USER,
        content=[
            TextPart(text="What is in these?"),
            ImagePart(data=PNG, mime_type="image/png", provider_options={"detail": "low"}),
            FilePart(data=PDF, mime_type="application/pdf", filename="report.pdf"),
        ],
    )
    request = ModelRequest(
        messages=[
            Message.system("Be brief."),
            Message(role=MessageRole.DEVELOPER, content=[TextPart(text="Use tools.")]),
            user,
            Message.assistant("", [call]),
            Message.tool_result(call, "sunny"),
            Message.assistant("It is sunny."),
            Message.user("thanks"),
        ],
        tools=[WEATHER],
    )
    server.reply_text("ok")
    await model.request(request)
    body = only_body(server)
    png_url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    pdf_url = "data:application/pdf;base64," + base64.b64encode(PDF).decode()
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "Use tools."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in these?"},
                {"type": "image_url", "image_url": {"url": png_url, "detail": "low"}},
                {"type": "file", "file": {"filename": "report.pdf", "file_data": pdf_url}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_7",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_7", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "thanks"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city.",
                "parameters": WEATHER.parameters,
            },
        }
    ]
    assert "stream" not in body


async def test_pdf_without_filename_gets_one(server: OpenAIServer, model: OpenAIChatModel) -> None:
    user = Message(content=[FilePart(data=PDF, mime_type="application/pdf")])
    server.reply_text("ok")
    await model.request(ModelRequest(messages=[user]))
    part = only_body(server)["messages"][0]["content"][0]
    assert part["file"]["filename"] == "attachment.pdf"


async def test_attachment_outside_user_message_is_refused(
    server: OpenAIServer, model: OpenAIChatModel
) -> None:
    image = ImagePart(data=PNG, mime_type="image/png")
    system = Message(role=MessageRole.SYSTEM, content=[TextPart(text="x"), image])
    with pytest.raises(ModelError, match="put attachments in a user message"):
        await model.request(ModelRequest(messages=[system, Message.user("hi")]))
    assert server.requests == []


async def test_extra_body_and_headers(server: OpenAIServer) -> None:
    chat = OpenAIChatModel(
        "gpt-x",
        base_url=server.url + "/",
        api_key="k",
        extra_body={"temperature": 0.2, "max_completion_tokens": 50},
        headers={"X-Trace": "abc"},
    )
    server.reply_text("ok")
    async with chat:
        await chat.request(ask())
    body = only_body(server)
    assert body["temperature"] == 0.2
    assert body["max_completion_tokens"] == 50
    assert server.requests[0].headers["x-trace"] == "abc"
    assert server.requests[0].path == "/v1/chat/completions"


async def test_tool_calls_are_parsed(server: OpenAIServer, model: OpenAIChatModel) -> None:
    server.reply_tool_calls(
        [
            {"id": "call_a", "name": "get_weather", "arguments": {"city": "Oslo"}},
            {"id": "call_b", "name": "now", "arguments": ""},
        ],
        text="Checking.",
    )
    answer = await model.request(ask(tools=[WEATHER]))
    assert answer.text == "Checking."
    assert answer.tool_calls == [
        ToolCall(id="call_a", name="get_weather", arguments={"city": "Oslo"}),
        ToolCall(id="call_b", name="now", arguments={}),
    ]


async def test_tool_call_without_id_gets_one(server: OpenAIServer, model: OpenAIChatModel) -> None:
    function = {"name": "now", "arguments": "{}"}
    server.reply_message({"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": function}]})  # fmt: skip
    answer = await model.request(ask())
    assert answer.tool_calls[0].id.startswith("call_")
    assert answer.tool_calls[0].name == "now"


async def test_streaming_text_deltas_in_order(server: OpenAIServer, model: OpenAIChatModel) -> None:
    server.reply_stream(["Hel", "lo", ", ", "world", "!"])
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    answer = await model.request(ask(), on_text_delta=on_delta)
    assert deltas == ["Hel", "lo", ", ", "world", "!"]
    assert answer.text == "Hello, world!"
    body = only_body(server)
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert server.requests[0].headers["accept"] == "text/event-stream"


async def test_streaming_tool_call_deltas_are_assembled(
    server: OpenAIServer, model: OpenAIChatModel
) -> None:
    server.reply_stream(
        [
            "Let me look.",
            tool_call_chunk(0, id="call_a", name="get_weather"),
            tool_call_chunk(1, id="call_b", name="get_weather", arguments='{"ci'),
            tool_call_chunk(0, arguments='{"city": '),
            tool_call_chunk(1, arguments='ty": "Rome"}'),
            tool_call_chunk(0, arguments='"Oslo"}'),
        ],
        finish_reason="tool_calls",
    )
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    answer = await model.request(ask(tools=[WEATHER]), on_text_delta=on_delta)
    assert deltas == ["Let me look."]
    assert answer.text == "Let me look."
    assert answer.tool_calls == [
        ToolCall(id="call_a", name="get_weather", arguments={"city": "Oslo"}),
        ToolCall(id="call_b", name="get_weather", arguments={"city": "Rome"}),
    ]


async def test_scripted_replies_stream_when_asked(
    server: OpenAIServer, model: OpenAIChatModel
) -> None:
    server.reply_tool_call("get_weather", {"city": "Oslo"})
    server.reply_text("It is sunny in Oslo.")
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    first = await model.request(ask(), on_text_delta=on_delta)
    second = await model.request(ask(), on_text_delta=on_delta)
    assert first.tool_calls == [
        ToolCall(id="call_1", name="get_weather", arguments={"city": "Oslo"})
    ]
    assert len(deltas) > 1
    assert "".join(deltas) == second.text == "It is sunny in Oslo."


async def test_json_answer_to_a_stream_request_is_one_delta(
    server: OpenAIServer, model: OpenAIChatModel
) -> None:
    completion = {"choices": [{"message": {"role": "assistant", "content": "whole"}}]}
    server.reply_raw(json.dumps(completion))
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    answer = await model.request(ask(), on_text_delta=on_delta)
    assert answer.text == "whole"
    assert deltas == ["whole"]


class RecordingDelays(OpenAIChatModel):
    """Keeps the wait chosen before each retry (the waits themselves still happen)."""

    delays: list[float]

    def _delay(self, attempt: int, asked: float | None) -> float:
        chosen = super()._delay(attempt, asked)
        self.delays = [*getattr(self, "delays", []), chosen]
        return chosen


@pytest.mark.parametrize(
    ("header", "wait"),
    [
        ({"Retry-After": "0"}, 0.0),
        ({"retry-after-ms": "10"}, 0.01),
        ({"Retry-After": "0.05"}, 0.05),
    ],
)
async def test_retry_after_is_honoured_then_success(
    server: OpenAIServer, header: dict[str, str], wait: float
) -> None:
    chat = RecordingDelays("gpt-x", base_url=server.url, api_key="k", retry_base_delay=5)
    server.reply_status(429, headers=header)
    server.reply_text("finally")
    async with chat:
        answer = await chat.request(ask())
    assert answer.text == "finally"
    assert chat.delays == [wait]  # the server's wait, not the 2.5-5 s backoff
    assert len(server.requests) == 2
    assert server.requests[0].json == server.requests[1].json


async def test_retry_on_5xx_backs_off_then_succeeds(server: OpenAIServer) -> None:
    chat = RecordingDelays("gpt-x", base_url=server.url, api_key="k", retry_base_delay=0.01)
    server.reply_status(500)
    server.reply_status(502)
    server.reply_status(503, headers={"Retry-After": "0"})
    server.reply_text("recovered")
    async with chat:
        answer = await chat.request(ask())
    assert answer.text == "recovered"
    assert len(server.requests) == 4
    first, second, third = chat.delays
    assert 0.005 <= first <= 0.01  # exponential, with jitter in [50 %, 100 %]
    assert 0.01 <= second <= 0.02
    assert third == 0.0


async def test_gives_up_after_max_retries(server: OpenAIServer) -> None:
    chat = openai("gpt-x", base_url=server.url, api_key="k", max_retries=2, retry_base_delay=0)
    for _ in range(4):
        server.reply_status(503, message="overloaded")
    async with chat:
        with pytest.raises(ModelHTTPError) as caught:
            await chat.request(ask())
    assert caught.value.status_code == 503
    assert "overloaded" in caught.value.body
    assert len(server.requests) == 3
    assert server.pending == 1


async def test_gives_up_on_429_with_status(server: OpenAIServer) -> None:
    chat = openai("gpt-x", base_url=server.url, api_key="k", max_retries=0)
    server.reply_status(429, headers={"Retry-After": "0"}, message="rate limited")
    async with chat:
        with pytest.raises(ModelHTTPError, match="HTTP 429") as caught:
            await chat.request(ask())
    assert caught.value.status_code == 429
    assert len(server.requests) == 1


@pytest.mark.parametrize("status", [400, 401, 404, 422])
async def test_other_4xx_are_not_retried(
    server: OpenAIServer, model: OpenAIChatModel, status: int
) -> None:
    server.reply_status(status, message="bad request body")
    server.reply_text("never sent")
    with pytest.raises(ModelHTTPError) as caught:
        await model.request(ask())
    assert caught.value.status_code == status
    assert "bad request body" in caught.value.body
    assert len(server.requests) == 1
    assert server.pending == 1


async def test_env_vars_are_read(server: OpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    chat = openai("gpt-x")
    monkeypatch.delenv("OPENAI_API_KEY")  # read at construction, not at request time
    server.reply_text("ok")
    async with chat:
        await chat.request(ask())
    assert server.requests[0].headers["authorization"] == "Bearer sk-from-env"


async def test_arguments_win_over_env(
    server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    chat = openai("gpt-x", api_key="sk-arg", base_url=server.url)
    server.reply_text("ok")
    async with chat:
        await chat.request(ask())
    assert server.requests[0].headers["authorization"] == "Bearer sk-arg"


async def test_missing_key_for_openai_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    chat = openai("gpt-x")
    assert chat.base_url == "https://api.openai.com/v1"
    with pytest.raises(ModelError, match="OPENAI_API_KEY"):
        await chat.request(ask())


async def test_local_server_needs_no_key(
    server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    chat = openai("llama", base_url=server.url)
    server.reply_text("ok")
    async with chat:
        assert (await chat.request(ask())).text == "ok"
    assert "authorization" not in server.requests[0].headers


async def test_timeout_is_a_model_error(server: OpenAIServer) -> None:
    chat = openai("gpt-x", base_url=server.url, api_key="k", timeout=0.3, max_retries=0)
    server.reply_text("too late", delay=30)
    async with chat:
        with pytest.raises(ModelError, match=r"did not answer within 0\.3 s"):
            await chat.request(ask())


async def test_timeout_is_retried(server: OpenAIServer) -> None:
    chat = openai(
        "gpt-x", base_url=server.url, api_key="k", timeout=0.3, max_retries=1, retry_base_delay=0
    )
    server.reply_text("too late", delay=30)
    server.reply_text("in time")
    async with chat:
        assert (await chat.request(ask())).text == "in time"
    assert len(server.requests) == 2


async def test_connection_refused_is_a_model_error() -> None:
    port = free_loopback_port()  # nothing listens there
    chat = openai("gpt-x", base_url=f"http://127.0.0.1:{port}/v1", api_key="k",
                  max_retries=1, retry_base_delay=0)  # fmt: skip
    async with chat:
        with pytest.raises(ModelError, match="could not reach the model endpoint") as caught:
            await chat.request(ask())
    assert not isinstance(caught.value, ModelHTTPError)


MALFORMED = {
    "not json": ("<html>oops</html>", "not JSON"),
    "no choices": ('{"id": "x"}', "no choices"),
    "empty choices": ('{"choices": []}', "no choices"),
    "no message": ('{"choices": [{"index": 0}]}', "no choices\\[0\\].message"),
    "error object": ('{"error": {"message": "model overloaded"}}', "model overloaded"),
    "content not text": ('{"choices": [{"message": {"content": 5}}]}', "not a string"),
    "empty answer": ('{"choices": [{"message": {"content": null}}]}', "empty answer"),
    "cut off": (
        '{"choices": [{"message": {"content": ""}, "finish_reason": "length"}]}',
        "token limit",
    ),
}


def tool_call_body(arguments: str) -> str:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return json.dumps({"choices": [{"message": {"content": None, "tool_calls": [call]}}]})


MALFORMED |= {
    "arguments not json": (tool_call_body("{city: Oslo"), "not a JSON object"),
    "arguments a list": (tool_call_body("[1, 2]"), "not a JSON object"),
    "tool call without name": (tool_call_body("{}").replace('"f"', '""'), "without a name"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_malformed_response_is_a_model_error(
    server: OpenAIServer, model: OpenAIChatModel, case: str
) -> None:
    body, message = MALFORMED[case]
    server.reply_raw(body)
    with pytest.raises(ModelError, match=message) as caught:
        await model.request(ask())
    assert not isinstance(caught.value, ModelHTTPError)
    assert len(server.requests) == 1  # a nonsense answer is not retried


def sse(*events: str) -> str:
    return "".join(f"data: {event}\n\n" for event in events)


CHUNK = json.dumps({"choices": [{"index": 0, "delta": {"content": "Hi"}}]})
MALFORMED_STREAMS = {
    "no done": (sse(CHUNK), "ended before 'data: \\[DONE\\]'"),
    "invalid json": (sse(CHUNK, "{not json", "[DONE]"), "stream chunk is not JSON"),
    "empty stream": (sse("[DONE]"), "empty answer"),
    "error event": (sse(json.dumps({"error": {"message": "boom"}})), "boom"),
    "bad arguments": (
        sse(json.dumps(tool_call_chunk(0, id="c", name="f", arguments="{oops")), "[DONE]"),
        "not a JSON object",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_STREAMS))
async def test_malformed_stream_is_a_model_error(
    server: OpenAIServer, model: OpenAIChatModel, case: str
) -> None:
    body, message = MALFORMED_STREAMS[case]
    server.reply_raw(body, content_type="text/event-stream")

    async def on_delta(text: str) -> None:
        pass

    with pytest.raises(ModelError, match=message):
        await model.request(ask(), on_text_delta=on_delta)
    assert len(server.requests) == 1


async def test_stream_without_done_via_server_helper(
    server: OpenAIServer, model: OpenAIChatModel
) -> None:
    server.reply_stream(["partial"], done=False)
    seen: list[str] = []

    async def on_delta(text: str) -> None:
        seen.append(text)

    with pytest.raises(ModelError, match="cut off"):
        await model.request(ask(), on_text_delta=on_delta)
    assert seen == ["partial"]


async def test_given_http_client_is_used_and_left_open(server: OpenAIServer) -> None:
    async with httpx.AsyncClient() as client:
        chat = openai("gpt-x", base_url=server.url, api_key="k", http_client=client)
        server.reply_text("one")
        server.reply_text("two")
        assert (await chat.request(ask())).text == "one"
        await chat.aclose()
        assert not client.is_closed
        assert (await chat.request(ask())).text == "two"


async def test_usable_after_aclose(server: OpenAIServer, model: OpenAIChatModel) -> None:
    server.reply_text("one")
    server.reply_text("two")
    assert (await model.request(ask())).text == "one"
    await model.aclose()
    assert (await model.request(ask())).text == "two"


def test_usable_from_several_event_loops(server: OpenAIServer) -> None:
    chat = openai("gpt-x", base_url=server.url, api_key="k")
    server.reply_text("one")
    server.reply_text("two")

    async def once() -> str:
        try:
            return (await chat.request(ask())).text
        finally:
            await chat.aclose()

    assert asyncio.run(once()) == "one"
    assert asyncio.run(once()) == "two"


def test_no_reply_left_is_reported(server: OpenAIServer) -> None:
    response = httpx.post(server.url + "/chat/completions", json={"model": "m"})
    assert response.status_code == 400
    assert "no scripted reply left" in response.text


NOW = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "2"}, 2.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"Retry-After-Ms": "250"}, 0.25),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        ({"Retry-After": format_datetime(NOW + timedelta(seconds=7), usegmt=True)}, 7.0),
        ({"Retry-After": format_datetime(NOW - timedelta(seconds=7), usegmt=True)}, 0.0),
        ({"Retry-After": "3600"}, 60.0),
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": "-1"}, None),
        ({"retry-after-ms": "nan"}, None),
        ({}, None),
    ],
)
def test_retry_after_parsing(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after(headers, cap=60.0, now=NOW) == expected


def test_a_stream_tool_call_whose_function_is_not_an_object_is_a_model_error() -> None:
    chunk = {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": "oops"}]}}]}
    assembler = StreamAssembler()
    assembler.feed("data: " + json.dumps(chunk))
    with pytest.raises(ModelError, match="no function object"):
        assembler.feed("")  # the blank line that ends the event


async def test_an_answer_over_max_response_bytes_is_refused(server: OpenAIServer) -> None:
    small = openai("gpt-x", base_url=server.url, api_key="k", max_response_bytes=2000)
    try:
        server.reply_text("x" * 5000)
        with pytest.raises(ModelError, match="max_response_bytes=2000"):
            await small.request(ask())
        server.reply_text("fits")
        assert (await small.request(ask())).text == "fits"
    finally:
        await small.aclose()


async def test_an_error_body_is_kept_only_in_part(server: OpenAIServer) -> None:
    chat = openai("gpt-x", base_url=server.url, api_key="k", max_retries=0)
    try:
        server.reply_raw(b"e" * 200_000, status=400)
        with pytest.raises(ModelHTTPError) as caught:
            await chat.request(ask())
        assert caught.value.status_code == 400 and 0 < len(caught.value.body) <= 64 * 1024
    finally:
        await chat.aclose()

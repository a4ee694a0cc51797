"""A connection that drops part way through a streamed answer, before any text went out,
is retried like any dropped connection, on every wire: whether it is reset (the read
fails) or closed cleanly (the body just ends, before the stream's end marker). Once text
went out, a retry would hand it out again: the call ends with the error."""

from __future__ import annotations

import pytest

from convoq.errors import ModelError
from convoq.messages import Message
from convoq.models import ModelRequest
from convoq.models.openai import openai
from tests.support import sdk_wire as w
from tests.support.openai_server import OpenAIServer, tool_call_chunk


def ask() -> ModelRequest:
    return ModelRequest(messages=[Message.user("hi")])


async def streamed(model: object, deltas: list[str]) -> Message:
    async def on_delta(text: str) -> None:
        deltas.append(text)

    return await model.request(ask(), on_text_delta=on_delta)  # type: ignore[attr-defined]


@pytest.fixture
def server() -> OpenAIServer:
    with OpenAIServer() as running:
        yield running


TOOL_CALL = [tool_call_chunk(0, id="c1", name="f"), tool_call_chunk(0, arguments='{"a": 1}')]


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
@pytest.mark.parametrize("cut_after", [1, 2], ids=["after-role", "mid-tool-call"])
async def test_a_chat_stream_dropped_before_text_is_retried(
    server: OpenAIServer, reset: bool, cut_after: int
) -> None:
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}, *TOOL_CALL]
    server.reply_stream(chunks, finish_reason="tool_calls", cut_after=cut_after, reset=reset)
    server.reply_stream(chunks, finish_reason="tool_calls")
    model = openai("gpt-x", base_url=server.url, api_key="k", retry_base_delay=0.01)
    async with model:
        deltas: list[str] = []
        answer = await streamed(model, deltas)
    assert [c.arguments for c in answer.tool_calls] == [{"a": 1}]
    assert len(server.requests) == 2 and deltas == []


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
async def test_a_chat_stream_dropped_after_text_went_out_is_not_retried(
    server: OpenAIServer, reset: bool
) -> None:
    server.reply_stream(["Hel", "lo"], cut_after=1, reset=reset)  # "Hel", then the drop
    server.reply_stream(["Hel", "lo"])
    model = openai("gpt-x", base_url=server.url, api_key="k", retry_base_delay=0.01)
    async with model:
        deltas: list[str] = []
        with pytest.raises(ModelError, match=r"cut off|dropped"):
            await streamed(model, deltas)
    assert len(server.requests) == 1 and deltas == ["Hel"]


def _truncated_responses() -> str:
    events = w.responses_events(w.response([w.text_item("Hello")]))
    return w.sse(events[:1])  # response.created, then the body ends


def _truncated_anthropic() -> str:
    events = w.anthropic_events(w.anthropic_message([w.text_block("Hello")]))
    return w.sse(events[:1])  # message_start, then the body ends


@pytest.mark.parametrize("wire", ["responses", "anthropic"])
async def test_a_stream_ending_before_its_end_marker_is_retried(
    server: OpenAIServer, wire: str
) -> None:
    from convoq.models.anthropic import anthropic
    from convoq.models.responses import responses

    if wire == "responses":
        cut, whole = (
            _truncated_responses(),
            w.sse(w.responses_events(w.response([w.text_item("Hello")]))),
        )
        model = responses("gpt-x", base_url=server.url, api_key="k", retry_base_delay=0.01)
    else:
        message = w.anthropic_message([w.text_block("Hello")])
        cut, whole = _truncated_anthropic(), w.sse(w.anthropic_events(message))
        root = server.url.removesuffix("/v1")
        model = anthropic("claude-x", base_url=root, api_key="k", retry_base_delay=0.01)
    server.reply_raw(cut, content_type="text/event-stream")
    server.reply_raw(whole, content_type="text/event-stream")
    async with model:
        deltas: list[str] = []
        answer = await streamed(model, deltas)
    assert (answer.text, "".join(deltas), len(server.requests)) == ("Hello", "Hello", 2)

"""A connection that drops part way through a streamed answer, before any text went out,
is retried like any dropped connection, on every wire: whether it is reset (the read
fails) or closed cleanly (the body just ends, before the stream's end marker). Once text
went out, it is retried only when the handler can take the text back (its ``retract()``,
which the model calls first; the turn loop's handler has one, and says so to readers with
a ``text_retracted`` event); to a handler without one, a retry would hand the text out
twice, so the call ends with the error."""

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


class Retractable:
    """A text handler that can take text back: what it holds is the text since the last
    retraction, and ``log`` everything in order (``None`` for a retraction)."""

    def __init__(self) -> None:
        self.log: list[str | None] = []

    async def __call__(self, text: str) -> None:
        self.log.append(text)

    async def retract(self) -> None:
        self.log.append(None)

    @property
    def text(self) -> str:
        after = (
            self.log[len(self.log) - self.log[::-1].index(None) :] if None in self.log else self.log
        )
        return "".join(t for t in after if t is not None)


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
async def test_a_stream_dropped_after_text_went_out_to_a_plain_handler_is_not_retried(
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


def _cut_after_first_text(wire: str) -> tuple[str, str]:
    """A stream of "Hello" on ``wire`` cut after its first text ("Hell"), and the whole."""
    if wire == "responses":
        events = w.responses_events(w.response([w.text_item("Hello")]))
        return w.sse(events[:4]), w.sse(events)  # created, item, part, delta "Hell"
    events = w.anthropic_events(w.anthropic_message([w.text_block("Hello")]))
    return w.sse(events[:3]), w.sse(events)  # message_start, block start, first delta


@pytest.mark.parametrize("wire", ["chat-closed", "chat-reset", "responses", "anthropic"])
async def test_a_stream_dropped_after_text_went_out_is_retracted_then_retried(
    server: OpenAIServer, wire: str
) -> None:
    from convoq.models.anthropic import anthropic
    from convoq.models.responses import responses

    if wire.startswith("chat"):
        server.reply_stream(["Hel", "lo"], cut_after=1, reset=wire == "chat-reset")
        server.reply_stream(["Hel", "lo"])
        model: object = openai("gpt-x", base_url=server.url, api_key="k", retry_base_delay=0.01)
    else:
        cut, whole = _cut_after_first_text(wire)
        server.reply_raw(cut, content_type="text/event-stream")
        server.reply_raw(whole, content_type="text/event-stream")
        if wire == "responses":
            model = responses("gpt-x", base_url=server.url, api_key="k", retry_base_delay=0.01)
        else:
            root = server.url.removesuffix("/v1")
            model = anthropic("claude-x", base_url=root, api_key="k", retry_base_delay=0.01)
    handler = Retractable()
    async with model:  # type: ignore[attr-defined]
        answer = await model.request(ask(), on_text_delta=handler)  # type: ignore[attr-defined]
    first = handler.log[: handler.log.index(None)]
    assert first and "".join(first) == "Hello"[: len("".join(first))]  # some text, then cut
    assert handler.log.count(None) == 1 and len(server.requests) == 2
    assert handler.text == answer.text == "Hello"


async def test_a_retracted_call_out_of_retries_ends_with_the_error_and_no_retraction(
    server: OpenAIServer,
) -> None:
    server.reply_stream(["Hel", "lo"], cut_after=1)
    model = openai("gpt-x", base_url=server.url, api_key="k", max_retries=0)
    handler = Retractable()
    async with model:
        with pytest.raises(ModelError, match=r"cut off|dropped|ended"):
            await model.request(ask(), on_text_delta=handler)
    assert handler.log == ["Hel"] and len(server.requests) == 1

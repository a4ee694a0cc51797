"""Event streams read as the SSE standard says (WHATWG HTML, "Interpreting an event
stream"), by the one reader every model stream goes through: each framing a server or a
proxy may use (unknown fields, comments, ids and retry times, data over several lines,
CRLF, CR or LF line ends, a leading byte order mark, no space or two after the colon)
yields the same answer from each model wire over a loopback HTTP server; so does text
holding characters Python's ``splitlines`` would break a line at (U+2028, U+0085)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from convoq.messages import Message
from convoq.models import Model, ModelRequest, anthropic, openai, responses
from convoq.models._openai_wire import StreamAssembler
from convoq.models._sse import Event, LineSplitter, SSEBuffer
from tests.support import sdk_wire as w
from tests.support.openai_server import OpenAIServer, text_chunk

TEXT = "Hi there, friend"
# Both break a line for str.splitlines (and httpx's aiter_lines), neither does in SSE.
ODD_TEXT = "Hi\u2028there\u0085, friend"

Events = list[tuple[str | None, str]]  # (event name or None, data)


def chat_events(text: str = TEXT) -> Events:
    pieces = [text[:3], text[3:8], text[8:]]
    chunks = [json.dumps(text_chunk(p), ensure_ascii=False) for p in pieces]
    return [(None, chunk) for chunk in chunks] + [(None, "[DONE]")]


def _named(events: list[Any]) -> Events:
    out: Events = []
    for event in events:
        data = event.model_dump(mode="json") if hasattr(event, "model_dump") else event
        out.append((data["type"], json.dumps(data, ensure_ascii=False)))
    return out


def responses_events(text: str = TEXT) -> Events:
    return _named(w.responses_events(w.response([w.text_item(text)])))


def anthropic_events(text: str = TEXT) -> Events:
    return _named(w.anthropic_events(w.anthropic_message([w.text_block(text)])))


WIRES: dict[str, tuple[Callable[[str], Model], Callable[[str], Events]]] = {
    "chat completions": (
        lambda url: openai("gpt-x", base_url=url, api_key="k", retry_base_delay=0),
        chat_events,
    ),
    "responses": (
        lambda url: responses("gpt-x", base_url=url, api_key="k", retry_base_delay=0),
        responses_events,
    ),
    "anthropic": (
        lambda url: anthropic(
            "claude-x", base_url=url.removesuffix("/v1"), api_key="k", retry_base_delay=0
        ),
        anthropic_events,
    ),
}


def _event(name: str | None, data: str, *, colon: str = ": ", data_colon: str = "") -> str:
    head = f"event{colon}{name}\n" if name else ""
    lines = data.split("\n")
    return head + "".join(f"data{data_colon or colon}{line}\n" for line in lines) + "\n"


def plain(events: Events) -> str:
    return "".join(_event(name, data) for name, data in events)


def _multi_line(data: str) -> str:
    # Spread JSON over lines (whitespace between tokens); the reader joins them with "\n".
    if not data.startswith("{"):
        return data
    return json.dumps(json.loads(data), indent=1, ensure_ascii=False)


FRAMINGS: dict[str, Callable[[Events], str]] = {
    "plain": plain,
    "unknown fields are ignored": lambda events: "".join(
        "x-proxy-trace: 4f2a\n<html>\nfield-without-colon\nDATA: not data\n" + _event(n, d)
        for n, d in events
    ),
    "comments are ignored": lambda events: (
        ": stream opened\n\n"
        + "".join(f":keep-alive\n{_event(n, d)}: between\n\n" for n, d in events)
    ),
    "id and retry are read, bad ones ignored": lambda events: "".join(
        f"id: {i}\nretry: 3000\nretry: soon\nid: a\0b\n{_event(n, d)}"
        for i, (n, d) in enumerate(events)
    ),
    "data over several lines": lambda events: "".join(_event(n, _multi_line(d)) for n, d in events),
    "no space after the colon": lambda events: "".join(_event(n, d, colon=":") for n, d in events),
    "two spaces after a data colon (one is data)": lambda events: "".join(
        _event(n, d, data_colon=":  ") for n, d in events
    ),
    "CRLF line ends": lambda events: plain(events).replace("\n", "\r\n"),
    "CR line ends": lambda events: plain(events).replace("\n", "\r"),
    "a leading byte order mark": lambda events: "\ufeff" + plain(events),
    "no blank line after the last event": lambda events: plain(events).removesuffix("\n"),
}


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as running:
        yield running


@pytest.fixture(params=sorted(WIRES))
async def wire(request: pytest.FixtureRequest, server: OpenAIServer) -> AsyncIterator[Any]:
    build, events = WIRES[request.param]
    model = build(server.url)
    yield model, events
    await model.aclose()


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
async def test_every_framing_reads_the_same_answer_over_http(
    server: OpenAIServer, wire: Any, framing: str
) -> None:
    model, events = wire
    server.reply_raw(FRAMINGS[framing](events(TEXT)).encode(), content_type="text/event-stream")
    assert await _answer(model) == (TEXT, TEXT)


async def test_only_cr_and_lf_end_a_line(server: OpenAIServer, wire: Any) -> None:
    model, events = wire
    server.reply_raw(plain(events(ODD_TEXT)).encode(), content_type="text/event-stream")
    assert await _answer(model) == (ODD_TEXT, ODD_TEXT)


async def _answer(model: Model) -> tuple[str, str]:
    """The answer's text and the text its deltas carried."""
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    request = ModelRequest(messages=[Message.user("hi")])
    answer = await model.request(request, on_text_delta=on_delta)
    return answer.text, "".join(deltas)


# -- the reader itself, chunk by chunk --------------------------------------------------------
def _read(body: bytes, size: int) -> list[Event]:
    splitter, buffer, out = LineSplitter(), SSEBuffer(), []
    lines = [line for i in range(0, len(body), size) for line in splitter.feed(body[i : i + size])]
    for line in [*lines, *splitter.end()]:
        event = buffer.feed(line)
        if event is not None:
            out.append(event)
    last = buffer.flush()
    return [*out, last] if last else out


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
def test_any_chunking_of_the_body_reads_the_same_events(framing: str) -> None:
    """A CRLF, a multi-byte character or the byte order mark split between two reads
    changes nothing."""
    events = anthropic_events(ODD_TEXT)
    body = FRAMINGS[framing](events).encode()
    whole = _read(body, len(body))
    assert [e.event for e in whole] == [name for name, _ in events]
    for size in (1, 2, 3, 7):
        assert _read(body, size) == whole


def test_fields_as_the_standard_reads_them() -> None:
    body = (
        b"data:  two spaces\n"  # one is stripped, one is data
        b"data\n"  # no colon: a field with an empty value
        b"event:custom\n"
        b"id: 42\n"
        b"retry: 1500\n\n"
        b"event: ignored\n\n"  # no data: nothing is dispatched, the name is dropped
        b"data: x\n"
        b"id: bad\0id\n"  # a NUL: the last id stays
        b"retry: 10s\n\n"  # not digits: the retry stays
    )
    assert _read(body, len(body)) == [
        Event("custom", " two spaces\n", "42", 1500),
        Event("message", "x", "42", 1500),
    ]


def test_a_chat_chunk_is_read_when_its_event_ends() -> None:
    """Data lines make one event at the blank line; not each line on its own."""
    assembler = StreamAssembler()
    chunk = json.dumps(text_chunk("Hi"), indent=1)
    assert [assembler.feed(f"data: {line}") for line in chunk.split("\n")] == [None] * len(
        chunk.split("\n")
    )
    assert assembler.feed("") == "Hi"

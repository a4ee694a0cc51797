"""A scripted OpenAI Chat Completions server on a free loopback port, in a thread.

Queue replies, point a model at ``server.url``, then look at what arrived::

    with OpenAIServer() as server:
        server.reply_tool_call("get_weather", {"city": "Oslo"})
        server.reply_text("It is sunny.")
        model = openai("gpt-x", base_url=server.url)
        ...
        assert server.requests[1].json["messages"][-1]["role"] == "tool"

Each request takes the next reply in order. Replies made with :meth:`reply_text`,
:meth:`reply_tool_call` and :meth:`reply_message` follow the request like a real server:
a JSON completion, or an SSE stream when the request says ``"stream": true``.
:meth:`reply_stream` always streams the chunks given (or drops the connection part way:
``cut_after``, ``reset``); :meth:`reply_status` and :meth:`reply_raw` send exactly what
they are told; :meth:`reply_keepalive` sends SSE comments and never an answer,
:meth:`reply_silent` nothing at all. Replies carry a usage
object (``usage=None``: none, as servers that do not report it). With no reply left the
server answers 400 with a message saying so.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Json = dict[str, Any]

_USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
_USAGE_DEFAULT: Json = {"default": True}  # marker: the usage above


@dataclass
class RecordedRequest:
    """One request as the server received it (header names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        """The body parsed as JSON (``None`` when it is not JSON)."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None


@dataclass
class _Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None  # sent as is
    message: Json | None = None  # rendered as JSON or SSE, as the request asks
    chunks: list[Json] | None = None  # always sent as SSE
    finish_reason: str | None = "stop"
    done: bool = True
    delay: float = 0.0
    usage: Json | None = field(default_factory=lambda: dict(_USAGE))
    keepalive: float | None = None  # send ": keep-alive" this often, and nothing else
    cut_at: int | None = None  # send only this many bytes of the body, then hang up
    cut_after: int | None = None  # send only this many stream chunks, then hang up
    reset: bool = False  # hang up with a TCP reset (RST) rather than a clean close (FIN)


def text_chunk(text: str, *, index: int = 0) -> Json:
    """A stream chunk carrying a text delta (of choice ``index``)."""
    return {"choices": [{"index": index, "delta": {"content": text}, "finish_reason": None}]}


def refusal_chunk(text: str) -> Json:
    """A stream chunk carrying a refusal delta."""
    return {"choices": [{"index": 0, "delta": {"refusal": text}, "finish_reason": None}]}


def tool_call_chunk(
    index: int, *, id: str | None = None, name: str | None = None, arguments: str = ""
) -> Json:
    """A stream chunk with (part of) tool call ``index``: id and name once, arguments in pieces."""
    call: Json = {"index": index, "function": {"arguments": arguments}}
    if id is not None:
        call["id"] = id
        call["type"] = "function"
    if name is not None:
        call["function"]["name"] = name
    return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]}


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    # HTTP/1.0: one request per connection, so no pooled sockets outlive a test's event loop.
    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        headers = {k.lower(): v for k, v in self.headers.items()}
        owner = self.server.owner
        reply = owner._record(RecordedRequest("POST", self.path, headers, body))
        if reply.delay and owner._closing.wait(reply.delay):
            return
        if reply.keepalive is not None:
            self._send_keepalive(reply.keepalive)
            return
        stream = _wants_stream(body)
        if reply.chunks is not None or (reply.message is not None and stream):
            self._send_sse(reply, _model_of(body))
        else:
            body = _render_body(reply, _model_of(body))
            self._send(reply.status, reply.headers, body, cut_at=reply.cut_at)

    do_GET = do_POST

    def _send(
        self, status: int, headers: Mapping[str, str], body: bytes, *, cut_at: int | None = None
    ) -> None:
        self.send_response(status)
        lowered = {k.lower() for k in headers}
        if "content-type" not in lowered:
            self.send_header("Content-Type", "application/json")
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body if cut_at is None else body[:cut_at])

    def _send_sse(self, reply: _Reply, model: str) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", "text/event-stream")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        for index, chunk in enumerate(_stream_chunks(reply)):
            if index == reply.cut_after:
                self._hang_up(reset=reply.reset)
                return
            event = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "model": model}
            self.wfile.write(b"data: " + json.dumps({**event, **chunk}).encode() + b"\n\n")
            self.wfile.flush()
        if reply.done:
            self.wfile.write(b"data: [DONE]\n\n")

    def _hang_up(self, *, reset: bool) -> None:
        """End the connection mid-answer: a clean close (the body, close-delimited, just
        ends) or a TCP reset (linger 0: the client's read fails)."""
        self.wfile.flush()
        if reset:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()

    def _send_keepalive(self, every: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        # Until the client hangs up (the write then fails) or the server stops.
        while not self.server.owner._closing.wait(every):
            self.wfile.write(b": keep-alive\n\n")
            self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, owner: OpenAIServer) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out and hung up is part of what tests script


class OpenAIServer:
    """A Chat Completions server with scripted replies; a context manager."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self._replies: deque[_Reply] = deque()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._http: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL to give a model (``.../v1``)."""
        if self._http is None:
            raise RuntimeError("OpenAIServer is not started; use it as a context manager")
        return f"http://127.0.0.1:{self._http.server_address[1]}/v1"

    @property
    def pending(self) -> int:
        """Replies queued and not yet sent."""
        return len(self._replies)

    def start(self) -> None:
        self._http = _HTTPServer(self)
        # A short poll interval keeps shutdown (and so each test's teardown) quick.
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._closing.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> OpenAIServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # Replies, answered in the order they were queued.

    def reply_text(
        self,
        text: str,
        *,
        finish_reason: str = "stop",
        delay: float = 0.0,
        usage: Json | None = _USAGE_DEFAULT,
    ) -> None:
        """An assistant text answer (JSON, or SSE when the request streams)."""
        message = {"role": "assistant", "content": text}
        reply = _Reply(message=message, finish_reason=finish_reason, delay=delay)
        self._push(_with_usage(reply, usage))

    def reply_tool_call(
        self, name: str, arguments: Mapping[str, Any] | str, *, id: str = "call_1", text: str = ""
    ) -> None:
        """One tool call (``arguments`` as a dict, or a raw string sent verbatim)."""
        self.reply_tool_calls([{"id": id, "name": name, "arguments": arguments}], text=text)

    def reply_tool_calls(self, calls: Sequence[Mapping[str, Any]], *, text: str = "") -> None:
        """Several tool calls, each ``{"name", "arguments", "id"?}``."""
        wire = []
        for index, call in enumerate(calls):
            arguments = call.get("arguments", {})
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            function = {"name": call["name"], "arguments": arguments}
            wire.append({"id": call.get("id", f"call_{index + 1}"), "type": "function",
                         "function": function})  # fmt: skip
        message = {"role": "assistant", "content": text or None, "tool_calls": wire}
        self._push(_Reply(message=message, finish_reason="tool_calls"))

    def reply_message(
        self,
        message: Json,
        *,
        finish_reason: str | None = "stop",
        usage: Json | None = _USAGE_DEFAULT,
    ) -> None:
        """Any ``choices[0].message`` object, rendered like :meth:`reply_text`."""
        self._push(_with_usage(_Reply(message=message, finish_reason=finish_reason), usage))

    def reply_stream(
        self,
        chunks: Sequence[str | Json],
        *,
        finish_reason: str | None = "stop",
        done: bool = True,
        usage: Json | None = _USAGE_DEFAULT,
        cut_after: int | None = None,
        reset: bool = False,
    ) -> None:
        """An SSE stream: a ``str`` is a text delta, a dict a whole chunk (see
        :func:`tool_call_chunk`); then the finish chunk, a usage chunk (unless ``usage``
        is None) and, if ``done``, ``data: [DONE]``. With ``cut_after``, the connection
        drops after that many chunks: closed cleanly, or reset (``reset=True``)."""
        items = [text_chunk(c) if isinstance(c, str) else dict(c) for c in chunks]
        reply = _Reply(chunks=items, finish_reason=finish_reason, done=done,
                       cut_after=cut_after, reset=reset)  # fmt: skip
        self._push(_with_usage(reply, usage))

    def reply_keepalive(self, every: float = 0.5) -> None:
        """An event stream that sends only ``: keep-alive`` comments, ``every`` seconds,
        until the client gives up."""
        self._push(_Reply(keepalive=every))

    def reply_silent(self, seconds: float = 30.0) -> None:
        """Accept the request and send nothing for ``seconds`` (then a 504)."""
        body = json.dumps({"error": {"message": "silent", "type": "test_error"}}).encode()
        self._push(_Reply(status=504, body=body, delay=seconds))

    def reply_status(
        self,
        status: int,
        *,
        headers: Mapping[str, str] | None = None,
        message: str | None = None,
    ) -> None:
        """An HTTP error status with an OpenAI-style error body."""
        error = {"message": message or f"scripted HTTP {status}", "type": "test_error"}
        body = json.dumps({"error": error}).encode()
        self._push(_Reply(status=status, headers=dict(headers or {}), body=body))

    def reply_raw(
        self,
        body: bytes | str,
        *,
        status: int = 200,
        content_type: str = "application/json",
        delay: float = 0.0,
    ) -> None:
        """Exactly these bytes, for responses no real server should send."""
        data = body.encode() if isinstance(body, str) else body
        headers = {"Content-Type": content_type}
        self._push(_Reply(status=status, headers=headers, body=data, delay=delay))

    def reply_cut(
        self, body: bytes | str, *, cut_at: int, content_type: str = "application/json"
    ) -> None:
        """Announce the whole ``body`` (its Content-Length), send its first ``cut_at`` bytes
        and hang up: a connection that drops mid-answer."""
        data = body.encode() if isinstance(body, str) else body
        headers = {"Content-Type": content_type}
        self._push(_Reply(headers=headers, body=data, cut_at=cut_at))

    def _push(self, reply: _Reply) -> None:
        with self._lock:
            self._replies.append(reply)

    def _record(self, request: RecordedRequest) -> _Reply:
        with self._lock:
            self.requests.append(request)
            if self._replies:
                return self._replies.popleft()
        message = f"OpenAIServer has no scripted reply left for request {len(self.requests)}"
        error = json.dumps({"error": {"message": message, "type": "test_error"}}).encode()
        return _Reply(status=400, body=error)


def _with_usage(reply: _Reply, usage: Json | None) -> _Reply:
    reply.usage = dict(_USAGE) if usage is _USAGE_DEFAULT else usage
    return reply


def _wants_stream(body: bytes) -> bool:
    try:
        return bool(json.loads(body).get("stream"))
    except (ValueError, AttributeError):
        return False


def _model_of(body: bytes) -> str:
    try:
        return str(json.loads(body).get("model", "test-model"))
    except (ValueError, AttributeError):
        return "test-model"


def _render_body(reply: _Reply, model: str) -> bytes:
    if reply.body is not None:
        return reply.body
    choice = {"index": 0, "message": reply.message, "finish_reason": reply.finish_reason}
    completion = {"id": "chatcmpl-test", "object": "chat.completion", "created": 0,
                  "model": model, "choices": [choice]}  # fmt: skip
    if reply.usage is not None:
        completion["usage"] = reply.usage
    return json.dumps(completion).encode()


def _stream_chunks(reply: _Reply) -> Iterator[Json]:
    if reply.chunks is not None:
        yield from reply.chunks
    else:
        yield from _message_as_chunks(reply.message or {})
    end = {"index": 0, "delta": {}, "finish_reason": reply.finish_reason}
    yield {"choices": [end]}
    if reply.usage is not None:
        yield {"choices": [], "usage": reply.usage}


def _message_as_chunks(message: Json) -> Iterator[Json]:
    yield {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
    text = message.get("content") or ""
    for start in range(0, len(text), 4):  # several deltas, as a real server sends
        yield text_chunk(text[start : start + 4])
    if message.get("refusal"):
        yield refusal_chunk(message["refusal"])
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        yield tool_call_chunk(index, id=call["id"], name=function["name"])
        arguments = function["arguments"]
        half = len(arguments) // 2
        yield tool_call_chunk(index, arguments=arguments[:half])
        yield tool_call_chunk(index, arguments=arguments[half:])

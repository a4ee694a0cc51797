"""Anthropic Messages answers, without I/O: a message object, or its event stream.

Stop reasons become convoq's finish reasons: ``end_turn``, ``stop_sequence`` and
``pause_turn`` -> ``stop``; ``max_tokens`` and ``model_context_window_exceeded`` ->
``length``; ``tool_use`` -> ``tool_calls``; ``refusal`` -> ``content_filter`` with the
message's ``refusal`` set. An answer given through the output tool (see
:mod:`convoq.models._anthropic_wire`) becomes the message's text, as JSON.
"""

from __future__ import annotations

import json
from typing import Any

from convoq.errors import ModelError, ModelHTTPError
from convoq.messages import Message
from convoq.models._http_attempt import RetryableError, cut_off
from convoq.models._sse import SSEBuffer, event_object, excerpt
from convoq.models._wire_common import Json, answer, count, get, load_json
from convoq.usage import Usage

FINISH = {"end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop",
          "max_tokens": "length", "model_context_window_exceeded": "length",
          "tool_use": "tool_calls", "refusal": "content_filter"}  # fmt: skip
STREAM_ERROR_STATUS = {"overloaded_error": 529, "api_error": 500, "rate_limit_error": 429}
REFUSED = "the model declined to answer (stop_reason 'refusal')"


def message_of(data: Any, output_tool: str | None) -> Message:
    """The assistant message of a Messages API message object, or ModelError."""
    if not isinstance(data, dict):
        raise ModelError(f"the model response is not a JSON object: {excerpt(data)}")
    if data.get("type") == "error" or "error" in data:
        raise _reported(data)
    content = data.get("content")
    if not isinstance(content, list):
        raise ModelError(f"the model response has no content list: {excerpt(data)}")
    text = "".join(str(b.get("text") or "") for b in content if get(b, "type") == "text")
    calls = [b for b in content if get(b, "type") == "tool_use"]
    stop = data.get("stop_reason")
    finish = FINISH.get(stop, stop) if isinstance(stop, str) else None
    usage = parse_usage(data.get("usage"))
    typed = [c for c in calls if c.get("name") == output_tool]
    if output_tool is not None and typed and len(typed) == len(calls):
        # The typed answer, given as the output tool's input: that is the final text.
        return answer(json.dumps(typed[0].get("input")), [], "stop", usage=usage)
    calls = [c for c in calls if c.get("name") != output_tool]  # other tools run first
    triples = [(c.get("id"), c.get("name"), _arguments(c.get("input"))) for c in calls]
    if stop == "refusal":
        return answer("", [], finish, refusal=text or REFUSED, usage=usage)
    return answer(text, triples, finish, usage=usage)


def _arguments(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, dict) else value


def _reported(data: Json) -> ModelError:
    error = data.get("error")
    detail = get(error, "message") or error or excerpt(data)
    return ModelError(f"the model endpoint reported an error: {detail}", code=get(error, "type"))


def _stream_error(event: Json) -> Exception:
    """An ``error`` event after the 200: an overloaded, failing or rate-limited API is
    retried like the HTTP status it stands for (unless text went out already)."""
    error = _reported(event)
    status = STREAM_ERROR_STATUS.get(get(event, "error", "type"))
    if status is None:
        return error
    http = ModelHTTPError(f"{error.message} (in the stream, as HTTP {status})",
                          status_code=status, body=json.dumps(event))  # fmt: skip
    return RetryableError(http)


def parse_usage(data: Any) -> Usage | None:
    """Anthropic usage as convoq's: prompt tokens count the cached reads and writes too
    (Anthropic's ``input_tokens`` leaves them out); ``cached_tokens`` are the reads."""
    if not isinstance(data, dict):
        return None
    read = count(data.get("cache_read_input_tokens"))
    prompt = count(data.get("input_tokens")) + read + count(data.get("cache_creation_input_tokens"))
    completion = count(data.get("output_tokens"))
    return Usage(
        requests=1, prompt_tokens=prompt, completion_tokens=completion,
        total_tokens=prompt + completion, cached_tokens=read,
        reasoning_tokens=count(get(data, "output_tokens_details", "thinking_tokens")),
    )  # fmt: skip


HANDLED_EVENTS = (
    "message_start",
    "content_block_start",
    "content_block_delta",
    "message_delta",
    "message_stop",
    "error",
)
"""The stream events :class:`AnthropicStream` reads; every other one is ignored."""


class AnthropicStream:
    """Reads a Messages event stream into one message.

    Events handled (all others, present and future, are ignored, ``ping`` among them):

    - ``message_start``: the message, with its first usage;
    - ``content_block_start``: a new block (``text``, ``tool_use``, others kept as given);
    - ``content_block_delta``: ``text_delta`` (handed out as it arrives) and
      ``input_json_delta`` (a tool's input, in pieces); other deltas are ignored;
    - ``message_delta``: the stop reason and the usage so far;
    - ``message_stop``: the end; a body that ends without it was cut off: retried as a
      dropped connection is, as long as no text was handed out yet (else ModelError);
    - ``error``: ModelError with the server's message; ``overloaded_error``,
      ``api_error`` and ``rate_limit_error`` are retried as HTTP 529, 500 and 429 would be,
      as long as no text was handed out yet.
    """

    def __init__(self, output_tool: str | None = None) -> None:
        self._sse = SSEBuffer()
        self._output_tool = output_tool
        self._message: Json = {}
        self._blocks: dict[int, Json] = {}
        self._inputs: dict[int, list[str]] = {}
        self._usage: Json = {}
        self._stopped = False

    def feed(self, line: str) -> str | None:
        event = self._sse.feed(line)
        return None if event is None else self._take(event_object(event.data))

    def _take(self, event: Json) -> str | None:
        kind = event.get("type")
        index = event.get("index")
        if kind == "message_start":
            self._message = dict(event.get("message") or {})
            self._usage.update(get(self._message, "usage") or {})
        elif kind == "content_block_start" and isinstance(index, int):
            self._blocks[index] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta" and isinstance(index, int):
            return self._delta(index, event.get("delta"))
        elif kind == "message_delta":
            self._message.update(event.get("delta") or {})
            self._usage.update({k: v for k, v in (event.get("usage") or {}).items()
                                if v is not None})  # fmt: skip
        elif kind == "message_stop":
            self._stopped = True
        elif kind == "error":
            raise _stream_error(event)
        return None

    def _delta(self, index: int, delta: Any) -> str | None:
        block = self._blocks.setdefault(index, {})
        if get(delta, "type") == "text_delta":
            text = str(delta.get("text") or "")
            block["text"] = str(block.get("text") or "") + text
            return text or None
        if get(delta, "type") == "input_json_delta":
            self._inputs.setdefault(index, []).append(str(delta.get("partial_json") or ""))
        return None

    def finish(self) -> Message:
        last = self._sse.flush()
        if last is not None:
            self._take(event_object(last.data))
        if not self._stopped:
            raise cut_off("message_stop")
        for index, pieces in self._inputs.items():
            raw = "".join(pieces).strip() or "{}"
            self._blocks[index]["input"] = load_json(raw, "tool input")
        content = [self._blocks[i] for i in sorted(self._blocks)]
        return message_of({**self._message, "content": content, "usage": self._usage},
                          self._output_tool)  # fmt: skip


def parse_message(raw: bytes, output_tool: str | None) -> Message:
    """The assistant message of a non-streamed response body."""
    return message_of(load_json(raw, "response body"), output_tool)

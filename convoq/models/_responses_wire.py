"""The OpenAI Responses wire format, without I/O: request bodies out, messages in.

History stays convoq's: every request sends the whole window as ``input`` items (system
and developer messages as such, user messages with ``input_text``/``input_image``/
``input_file`` parts, assistant text, ``function_call`` and ``function_call_output``
items) and ``store: false``, so nothing depends on what the server kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from convoq.errors import ModelError
from convoq.messages import FilePart, ImagePart, Message, MessageRole, TextPart
from convoq.model_settings import ModelSettings
from convoq.models._http_attempt import cut_off
from convoq.models._sse import SSEBuffer, event_object, excerpt
from convoq.models._wire_common import (
    Json,
    answer,
    count,
    data_url,
    file_name,
    get,
    is_strict_schema,
    load_json,
    merge_extra,
    refuse_settings,
)
from convoq.models.base import ModelRequest, ToolSpec
from convoq.usage import Usage

API = "OpenAI Responses API"


def build_body(
    model: str,
    request: ModelRequest,
    *,
    stream: bool,
    extra_body: Mapping[str, Any],
    strict_tools: bool | None,
) -> Json:
    """The JSON body of ``POST /responses``; ``strict_tools`` None: strict where the
    tool's schema qualifies."""
    refuse_settings(request.settings, API, "seed", "stop")
    items: list[Json] = []
    for message in request.messages:
        items.extend(input_items(message))
    body: Json = {"model": model, "input": items, "store": False}
    if request.tools:
        body["tools"] = [wire_tool(t, strict_tools) for t in request.tools]
    if stream:
        body["stream"] = True
    if request.settings is not None:
        body.update(_settings(request.settings))
    if request.output is not None:
        out = request.output
        schema = {"type": "json_schema", "name": out.name, "schema": out.json_schema}
        body["text"] = {"format": {**schema, "strict": out.strict}}
    return merge_extra(body, extra_body, request)


def _settings(settings: ModelSettings) -> Json:
    out: Json = {}
    for name, field in (("temperature", "temperature"), ("top_p", "top_p"),
                        ("max_tokens", "max_output_tokens"),
                        ("parallel_tool_calls", "parallel_tool_calls")):  # fmt: skip
        value = getattr(settings, name)
        if value is not None:
            out[field] = value
    choice = settings.tool_choice
    if choice is not None:
        named = choice not in ("auto", "required", "none")
        out["tool_choice"] = {"type": "function", "name": choice} if named else choice
    return out


def wire_tool(spec: ToolSpec, strict: bool | None) -> Json:
    """A function tool; ``strict`` is always sent (the API's default is strict)."""
    strict_now = is_strict_schema(spec.parameters) if strict is None else strict
    tool: Json = {"type": "function", "name": spec.name, "parameters": spec.parameters,
                  "strict": strict_now}  # fmt: skip
    if spec.description:
        tool["description"] = spec.description
    return tool


def input_items(message: Message) -> list[Json]:
    """One convoq message as Responses input items (an assistant message with tool calls
    becomes its text, if any, then one ``function_call`` item per call)."""
    role = message.role
    if role == MessageRole.TOOL:
        return [{"type": "function_call_output", "call_id": message.tool_call_id or "",
                 "output": message.text}]  # fmt: skip
    if role != MessageRole.USER and message.attachments:
        raise ModelError(
            f"a {role.value} message cannot carry images or files in the {API};"
            " put attachments in a user message"
        )
    if role == MessageRole.ASSISTANT:
        items: list[Json] = []
        said = message.text or message.refusal
        if said:
            items.append({"type": "message", "role": "assistant", "content": said})
        for call in message.tool_calls:
            items.append({"type": "function_call", "call_id": call.id, "name": call.name,
                          "arguments": json.dumps(call.arguments)})  # fmt: skip
        return items
    return [{"type": "message", "role": role.value, "content": _content(message)}]


def _content(message: Message) -> str | list[Json]:
    parts = message.content
    if len(parts) == 1 and isinstance(parts[0], TextPart):
        return parts[0].text
    return [_part(p) for p in parts]


def _part(part: TextPart | ImagePart | FilePart) -> Json:
    if isinstance(part, TextPart):
        return {"type": "input_text", "text": part.text}
    if isinstance(part, ImagePart):
        detail = part.provider_options.get("detail", "auto")
        return {"type": "input_image", "image_url": data_url(part), "detail": detail}
    return {"type": "input_file", "file_data": data_url(part), "filename": file_name(part)}


def parse_response(raw: bytes) -> Message:
    """The assistant message of a non-streamed response body, or ModelError."""
    return message_of(_object(load_json(raw, "response body"), raw))


def _object(data: Any, raw: Any) -> Json:
    if not isinstance(data, dict):
        raise ModelError(f"the model response is not a JSON object: {excerpt(raw)}")
    return data


def message_of(response: Json, fallback: list[Any] | None = None) -> Message:
    """The assistant message of a response object (``fallback``: the output items a stream
    delivered, for a final event that leaves ``output`` empty)."""
    _raise_failure(response)
    output = response.get("output") or fallback or []
    if not isinstance(output, list):
        raise ModelError(f"the model response output is not a list: {excerpt(output)}")
    text: list[str] = []
    refusal: list[str] = []
    calls: list[tuple[Any, Any, Any]] = []
    for item in output:
        kind = get(item, "type")
        if kind == "message":
            for part in get(item, "content") or []:
                if get(part, "type") == "output_text":
                    text.append(str(get(part, "text") or ""))
                elif get(part, "type") == "refusal":
                    refusal.append(str(get(part, "refusal") or ""))
        elif kind == "function_call":
            calls.append((get(item, "call_id"), get(item, "name"), get(item, "arguments")))
        # reasoning and built-in tool items carry nothing convoq keeps
    return answer(
        "".join(text), calls, finish_reason(response, bool(calls)),
        refusal="".join(refusal) or None, usage=parse_usage(response.get("usage")),
    )  # fmt: skip


def _raise_failure(response: Json) -> None:
    error = response.get("error")
    if response.get("status") == "failed" or error:
        detail = get(error, "message") or error or "no reason given"
        raise ModelError(f"the model endpoint reported an error: {detail}", code=get(error, "code"))


def finish_reason(response: Json, called: bool) -> str:
    """convoq's finish reason: ``length`` and ``content_filter`` for an incomplete
    response, ``tool_calls`` when it called tools, else ``stop``."""
    if response.get("status") == "incomplete":
        reason = get(response, "incomplete_details", "reason")
        return "length" if reason == "max_output_tokens" else str(reason or "incomplete")
    return "tool_calls" if called else "stop"


def parse_usage(data: Any) -> Usage | None:
    """A response's ``usage`` (None when absent), cached and reasoning tokens included."""
    if not isinstance(data, dict):
        return None
    usage = Usage(
        requests=1,
        prompt_tokens=count(data.get("input_tokens")),
        completion_tokens=count(data.get("output_tokens")),
        total_tokens=count(data.get("total_tokens")),
        cached_tokens=count(get(data, "input_tokens_details", "cached_tokens")),
        reasoning_tokens=count(get(data, "output_tokens_details", "reasoning_tokens")),
    )
    if not usage.total_tokens:  # a value: the sum goes in a copy
        total = usage.prompt_tokens + usage.completion_tokens
        usage = usage.model_copy(update={"total_tokens": total})
    return usage


HANDLED_EVENTS = (
    "response.output_text.delta",
    "response.output_item.done",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "error",
)
"""The stream events :class:`ResponsesStream` reads; every other one is ignored."""


class ResponsesStream:
    """Reads a Responses event stream into one message.

    Events handled (all others, present and future, are ignored):

    - ``response.output_text.delta``: text, handed out as it arrives;
    - ``response.output_item.done``: a finished output item (message, function call),
      kept in case the final event leaves ``output`` empty;
    - ``response.completed`` / ``response.incomplete``: the final response, read like a
      non-streamed one (text, refusal, tool calls, finish reason, usage);
    - ``response.failed`` and ``error``: ModelError with the server's message.
    """

    def __init__(self) -> None:
        self._sse = SSEBuffer()
        self._items: dict[int, Any] = {}
        self._final: Json | None = None

    def feed(self, line: str) -> str | None:
        event = self._sse.feed(line)
        return None if event is None else self._take(event_object(event.data))

    def _take(self, event: Json) -> str | None:
        kind = event.get("type")
        if kind == "response.output_text.delta":
            delta = event.get("delta")
            return delta if isinstance(delta, str) and delta else None
        if kind == "response.output_item.done":
            index = event.get("output_index")
            self._items[index if isinstance(index, int) else len(self._items)] = event.get("item")
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            self._final = _object(event.get("response"), event)
            _raise_failure(self._final)
        elif kind == "error":
            detail = event.get("message") or get(event, "error", "message") or excerpt(event)
            raise ModelError(f"the model stream reported an error: {detail}",
                             code=event.get("code"))  # fmt: skip
        return None

    def finish(self) -> Message:
        last = self._sse.flush()
        if last is not None:
            self._take(event_object(last.data))
        if self._final is None:
            raise cut_off("response.completed")
        items = [self._items[i] for i in sorted(self._items)]
        return message_of(self._final, fallback=items)

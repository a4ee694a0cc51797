"""The OpenAI Chat Completions wire format, without I/O: request bodies out, messages in.

:mod:`convoq.models.openai` does the HTTP; everything here is a pure function (or, for
streams, a small accumulator fed one line at a time), so it is tested without a server.
"""

from __future__ import annotations

import base64
import json
import math
import mimetypes
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from convoq.errors import ModelError, TruncatedAnswerError
from convoq.messages import FilePart, ImagePart, Message, MessageRole, TextPart, ToolCall
from convoq.model_settings import ModelSettings
from convoq.models._http_attempt import cut_off
from convoq.models._sse import SSEBuffer
from convoq.models.base import ModelRequest, OutputSpec, ToolSpec
from convoq.usage import Usage

Json = dict[str, Any]
_EXCERPT = 200


def build_body(
    model: str,
    request: ModelRequest,
    *,
    stream: bool,
    extra_body: Mapping[str, Any] | None,
    structured_output: bool = True,
) -> Json:
    """The JSON body of ``POST /chat/completions``: the request's settings as their wire
    fields, its output spec as ``response_format`` (unless ``structured_output`` is False:
    the server cannot take one), then ``extra_body`` (the model's), then the settings'
    own ``extra_body``: the keys merged last win."""
    body: Json = {"model": model, "messages": [wire_message(m) for m in request.messages]}
    if request.tools:
        body["tools"] = [wire_tool(t) for t in request.tools]
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if request.output is not None and structured_output:
        body["response_format"] = wire_output(request.output)
    body.update(wire_settings(request.settings, has_tools=bool(request.tools)))
    body.update(extra_body or {})
    if request.settings is not None:
        body.update(request.settings.extra_body or {})
    return body


def wire_settings(settings: ModelSettings | None, *, has_tools: bool) -> Json:
    """Chat Completions fields for ``settings`` (unset ones are left to the server).
    ``tool_choice`` and ``parallel_tool_calls`` go only with tools: the API refuses them
    on a request without any."""
    if settings is None:
        return {}
    fields: Json = {
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "max_completion_tokens": settings.max_tokens,
        "stop": settings.stop,
        "seed": settings.seed,
    }
    if has_tools:
        fields["tool_choice"] = _wire_tool_choice(settings.tool_choice)
        fields["parallel_tool_calls"] = settings.parallel_tool_calls
    return {key: value for key, value in fields.items() if value is not None}


def _wire_tool_choice(choice: str | None) -> str | Json | None:
    if choice is None or choice in ("auto", "required", "none"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def wire_output(spec: OutputSpec) -> Json:
    """``response_format`` asking for ``spec``'s JSON schema."""
    schema: Json = {"name": spec.name, "schema": spec.json_schema, "strict": spec.strict}
    return {"type": "json_schema", "json_schema": schema}


def wire_tool(spec: ToolSpec) -> Json:
    function: Json = {"name": spec.name, "parameters": spec.parameters}
    if spec.description:
        function["description"] = spec.description
    return {"type": "function", "function": function}


def wire_message(message: Message) -> Json:
    """One convoq message as a Chat Completions message."""
    role = message.role
    if role == MessageRole.TOOL:
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.text}
    if role != MessageRole.USER and message.attachments:
        raise ModelError(
            f"a {role.value} message cannot carry images or files in the Chat Completions"
            " format; put attachments in a user message"
        )
    out: Json = {"role": role.value, "content": _wire_content(message)}
    if role == MessageRole.ASSISTANT and (message.tool_calls or message.refusal is not None):
        if message.tool_calls:
            out["tool_calls"] = [_wire_tool_call(c) for c in message.tool_calls]
        if message.refusal is not None:
            out["refusal"] = message.refusal  # sent back as the API gave it
        if not message.content:
            out["content"] = None  # the API wants null, not "", beside tool calls or refusal
    if message.name is not None:
        out["name"] = message.name
    return out


def _wire_content(message: Message) -> str | list[Json]:
    parts = message.content
    # A lone text part goes as a plain string: every compatible server accepts that form.
    if not parts:
        return ""
    if len(parts) == 1 and isinstance(parts[0], TextPart):
        return parts[0].text
    return [_wire_part(p) for p in parts]


def _wire_part(part: TextPart | ImagePart | FilePart) -> Json:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    url = f"data:{part.mime_type};base64,{base64.b64encode(part.data).decode('ascii')}"
    if isinstance(part, ImagePart):
        return {"type": "image_url", "image_url": {"url": url, **part.provider_options}}
    filename = part.filename or "attachment" + (mimetypes.guess_extension(part.mime_type) or "")
    return {
        "type": "file",
        "file": {"filename": filename, "file_data": url, **part.provider_options},
    }


def _wire_tool_call(call: ToolCall) -> Json:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
    }


def parse_completion(raw: bytes) -> Message:
    """The assistant message of a non-streamed response body, or ModelError."""
    data = _loads(raw, "response body")
    choice = _first_choice(data)
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ModelError(f"the model response has no choices[0].message: {_excerpt(raw)}")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise ModelError(f"the model response content is not a string: {_excerpt(raw)}")
    refusal = message.get("refusal")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ModelError(f"the model response tool_calls is not a list: {_excerpt(raw)}")
    raw_calls: list[tuple[Any, Any, Any]] = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise ModelError(f"a tool call in the model response has no function: {call!r}")
        raw_calls.append((call.get("id"), function.get("name"), function.get("arguments")))
    return assemble(
        content or "",
        raw_calls,
        choice.get("finish_reason"),
        refusal=refusal if isinstance(refusal, str) and refusal else None,
        usage=parse_usage(data.get("usage")),
    )


def parse_usage(data: Any) -> Usage | None:
    """The ``usage`` object of a response or stream chunk (None when absent or unusable);
    cached and reasoning tokens from their ``*_details`` where the server reports them."""
    if not isinstance(data, dict):
        return None
    prompt_details = data.get("prompt_tokens_details")
    completion_details = data.get("completion_tokens_details")
    usage = Usage(
        requests=1,
        prompt_tokens=_count(data.get("prompt_tokens")),
        completion_tokens=_count(data.get("completion_tokens")),
        total_tokens=_count(data.get("total_tokens")),
        cached_tokens=_count(_get(prompt_details, "cached_tokens")),
        reasoning_tokens=_count(_get(completion_details, "reasoning_tokens")),
    )
    if not usage.total_tokens:  # a value: the sum goes in a copy
        total = usage.prompt_tokens + usage.completion_tokens
        usage = usage.model_copy(update={"total_tokens": total})
    return usage


def _get(data: Any, key: str) -> Any:
    return data.get(key) if isinstance(data, dict) else None


def _count(value: Any) -> int:
    # Servers send null, floats or nothing; a count that is not a whole number counts 0.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return max(0, int(value)) if math.isfinite(value) else 0


def _raise_reported_error(data: Any) -> None:
    error = data.get("error") if isinstance(data, dict) else None
    if error:
        detail = error.get("message", error) if isinstance(error, dict) else error
        raise ModelError(f"the model endpoint reported an error: {detail}")


def _first_choice(data: Any) -> Json:
    """Choice 0 (by its ``index``: with ``n`` > 1 the others are ignored)."""
    _raise_reported_error(data)
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices:
        raise ModelError(f"the model response has no choices: {_excerpt(data)}")
    choice = _choice_zero(choices)
    if choice is None:
        raise ModelError(f"the model response has no choice with index 0: {_excerpt(data)}")
    return choice


def _choice_zero(choices: list[Any]) -> Json | None:
    for position, choice in enumerate(choices):
        if isinstance(choice, dict) and choice.get("index", position) == 0:
            return choice
    return None


def assemble(
    text: str,
    calls: Sequence[Sequence[Any]],
    finish_reason: Any,
    *,
    refusal: str | None = None,
    usage: Usage | None = None,
) -> Message:
    """Build the assistant message from text and ``(id, name, arguments)`` triples."""
    tool_calls = [_tool_call(*c) for c in calls]
    finish = finish_reason if isinstance(finish_reason, str) and finish_reason else None
    if not text and not tool_calls and refusal is None:
        if finish == "length":
            raise TruncatedAnswerError(
                "the model hit its token limit before answering; raise max_tokens"
                " (model_settings={'max_tokens': ...}) or shorten the input",
                finish_reason=finish,
            )
        raise ModelError(
            f"the model returned an empty answer (finish_reason={finish_reason!r}):"
            " no text and no tool calls"
        )
    return Message.assistant(text, tool_calls, refusal=refusal, usage=usage, finish_reason=finish)


def _tool_call(call_id: Any, name: Any, arguments: Any) -> ToolCall:
    if not isinstance(name, str) or not name:
        raise ModelError(f"the model asked for a tool call without a name (id={call_id!r})")
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        arguments = "{}"  # some servers send "" for a tool without parameters
    if not isinstance(arguments, str):
        raise ModelError(f"arguments of tool call {name!r} are not a JSON string: {arguments!r}")
    try:
        decoded = json.loads(arguments)
    except ValueError:
        decoded = None
    if not isinstance(decoded, dict):
        raise ModelError(
            f"arguments of tool call {name!r} are not a JSON object: {_excerpt(arguments)}"
        )
    # Servers that omit ids still need one: the tool result is paired with its call by id.
    call_id = call_id if isinstance(call_id, str) and call_id else f"call_{uuid.uuid4().hex}"
    return ToolCall(id=call_id, name=name, arguments=decoded)


class StreamAssembler:
    """Accumulates a server-sent-event stream of chat completion chunks into one message.

    Only choice 0 is kept (by ``choices[i].index``: a request with ``n`` > 1 streams the
    other choices' chunks interleaved). Refusal deltas are kept apart from the text; the
    usage chunk (``stream_options.include_usage``) is kept, the last one winning.
    """

    def __init__(self) -> None:
        self.done = False
        self._sse = SSEBuffer()
        self._text: list[str] = []
        self._refusal: list[str] = []
        self._calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]
        self._finish_reason: Any = None
        self._usage: Usage | None = None

    def feed(self, line: str) -> str | None:
        """Take one line of the stream (read as :mod:`convoq.models._sse` says); return the
        text delta of the event it ends, if any."""
        event = self._sse.feed(line)
        return None if event is None else self._take_event(event.data)

    def _take_event(self, data: str) -> str | None:
        payload = data.strip()
        if payload == "[DONE]":
            self.done = True
            return None
        if self.done:
            raise ModelError("the model stream sent data after [DONE]")
        chunk = _loads(payload, "stream chunk")
        if not isinstance(chunk, dict):
            raise ModelError(f"a model stream chunk is not an object: {_excerpt(payload)}")
        _raise_reported_error(chunk)
        usage = parse_usage(chunk.get("usage"))
        if usage is not None:
            self._usage = usage
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices:
            return None  # the usage chunk has no choices
        choice = _choice_zero(choices)
        return None if choice is None else self._take(choice)

    def _take(self, choice: Json) -> str | None:
        if choice.get("finish_reason"):
            self._finish_reason = choice["finish_reason"]
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise ModelError(f"a model stream delta is not an object: {delta!r}")
        for position, call in enumerate(delta.get("tool_calls") or []):
            self._take_call(position, call)
        refusal = delta.get("refusal")
        if isinstance(refusal, str) and refusal:
            self._refusal.append(refusal)
        content = delta.get("content")
        if isinstance(content, str) and content:
            self._text.append(content)
            return content
        return None

    def _take_call(self, position: int, call: Any) -> None:
        if not isinstance(call, dict):
            raise ModelError(f"a tool call delta is not an object: {call!r}")
        index = call.get("index", position)
        entry = self._calls.setdefault(index if isinstance(index, int) else position, ["", "", ""])
        function = call.get("function") or {}
        if not isinstance(function, dict):
            raise ModelError(f"a tool call delta has no function object: {call!r}")
        # id and name come once (first one wins); arguments arrive in pieces.
        entry[0] = entry[0] or str(call.get("id") or "")
        entry[1] = entry[1] or str(function.get("name") or "")
        entry[2] += str(function.get("arguments") or "")

    def finish(self) -> Message:
        """The assembled message; a retryable cut-off if the stream did not end with [DONE]."""
        last = self._sse.flush()
        if last is not None:
            self._take_event(last.data)
        if not self.done:
            raise cut_off("'data: [DONE]'")
        calls = [self._calls[i] for i in sorted(self._calls)]
        refusal = "".join(self._refusal) or None
        return assemble(
            "".join(self._text), calls, self._finish_reason, refusal=refusal, usage=self._usage
        )


def _loads(raw: str | bytes, what: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        raise ModelError(f"the model {what} is not JSON: {_excerpt(raw)}") from None


def _excerpt(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = value if isinstance(value, str) else repr(value)
    return repr(text[:_EXCERPT] + ("..." if len(text) > _EXCERPT else ""))

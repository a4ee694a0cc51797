"""Wire conformance against the official ``openai`` and ``anthropic`` SDKs' own types.

Request bodies are checked against the SDKs' request TypedDicts (:func:`check_responses_body`,
:func:`check_anthropic_body`): pydantic validates them, and since TypedDict validation drops
keys it does not know, the validated value must equal the body sent: a key the SDK types do
not define (where they do not allow extra keys) or a value of the wrong shape fails.

Answers and stream events are built from the SDKs' response models (``Response``,
``ResponseStreamEvent``, ``Message``, ``RawMessageStreamEvent``), so what the models parse
is what the SDKs define; :func:`sse` renders them as a server sends them.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from anthropic.types import Message as AnthropicMessage
from anthropic.types import RawMessageStreamEvent
from anthropic.types import message_create_params as anthropic_params
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.responses import response_create_params as responses_params
from pydantic import BaseModel, TypeAdapter
from typing_extensions import TypedDict  # as the SDK's own request types

Json = dict[str, Any]

_RESPONSES = {
    True: TypeAdapter(responses_params.ResponseCreateParamsStreaming),
    False: TypeAdapter(responses_params.ResponseCreateParamsNonStreaming),
}


class _Sampling(TypedDict, total=False):
    # The sampling fields of anthropic-version 2023-06-01 (convoq's API_VERSION), typed as
    # the SDK's 0.x line had them: SDK 1.0 dropped them from its typed signature (its
    # migration guide sends them through extra_body, into the body as they are), 2.0
    # moved to another API version; the 2023-06-01 API takes them.
    temperature: float
    top_k: int
    top_p: float


class _AnthropicStreaming(anthropic_params.MessageCreateParamsStreaming, _Sampling):
    pass


class _AnthropicNonStreaming(anthropic_params.MessageCreateParamsNonStreaming, _Sampling):
    pass


_ANTHROPIC = {
    True: TypeAdapter(_AnthropicStreaming),
    False: TypeAdapter(_AnthropicNonStreaming),
}
RESPONSES_EVENT = TypeAdapter(ResponseStreamEvent)
ANTHROPIC_EVENT = TypeAdapter(RawMessageStreamEvent)


def event_classes(union: Any) -> dict[str, type[BaseModel]]:
    """The SDK's event classes by their ``type``."""
    members = typing.get_args(typing.get_args(union)[0])
    return {typing.get_args(m.model_fields["type"].annotation)[0]: m for m in members}


RESPONSES_EVENTS = event_classes(ResponseStreamEvent)
ANTHROPIC_EVENTS = event_classes(RawMessageStreamEvent)


def responses_event(data: Json | str) -> BaseModel:
    """The SDK's event object for ``data`` (its class chosen by ``type``), or a
    validation error naming what is missing."""
    value = json.loads(data) if isinstance(data, str) else data
    return RESPONSES_EVENTS[value["type"]].model_validate(value)


def _materialise(value: Any) -> Any:
    # pydantic validates Iterable[...] fields lazily: consuming them runs the validation.
    if isinstance(value, Mapping):
        return {k: _materialise(v) for k, v in value.items()}
    if isinstance(value, str | bytes | int | float | bool) or value is None:
        return value
    if isinstance(value, Iterable):
        return [_materialise(v) for v in value]
    return value


def _differences(sent: Any, kept: Any, path: str = "body") -> Iterator[str]:
    if isinstance(sent, dict) and isinstance(kept, dict):
        for key in sent:
            if key not in kept:
                yield f"{path}.{key} is not defined by the SDK's request types"
            else:
                yield from _differences(sent[key], kept[key], f"{path}.{key}")
    elif isinstance(sent, list) and isinstance(kept, list) and len(sent) == len(kept):
        for index, (a, b) in enumerate(zip(sent, kept, strict=True)):
            yield from _differences(a, b, f"{path}[{index}]")
    elif sent != kept:
        yield f"{path} = {sent!r} became {kept!r} under the SDK's request types"


def _conforms(adapters: Mapping[bool, TypeAdapter[Any]], body: Any) -> None:
    assert isinstance(body, dict), body
    kept = _materialise(adapters[bool(body.get("stream"))].validate_python(body))
    problems = list(_differences(body, kept))
    assert not problems, "\n".join(problems)


def check_responses_body(body: Any) -> None:
    """Fail unless ``body`` is a valid ``responses.create`` request of the openai SDK."""
    _conforms(_RESPONSES, body)


def check_anthropic_body(body: Any) -> None:
    """Fail unless ``body`` is a valid ``messages.create`` request of the anthropic SDK, as
    anthropic-version 2023-06-01 takes it (the SDK's types and the sampling fields)."""
    _conforms(_ANTHROPIC, body)


def sse(events: Iterable[BaseModel | Json], *, named: bool = True) -> str:
    """Server-sent events: ``event: TYPE`` (when ``named``) and ``data: JSON`` each."""
    out = []
    for event in events:
        data = event.model_dump(mode="json") if isinstance(event, BaseModel) else event
        head = f"event: {data['type']}\n" if named else ""
        out.append(f"{head}data: {json.dumps(data)}\n\n")
    return "".join(out)


# -- OpenAI Responses ----------------------------------------------------------------------

RESPONSES_USAGE: Json = {
    "input_tokens": 40,
    "input_tokens_details": {"cached_tokens": 30, "cache_write_tokens": 0},
    "output_tokens": 12,
    "output_tokens_details": {"reasoning_tokens": 8},
    "total_tokens": 52,
}


def text_item(text: str, *, id: str = "msg_1") -> Json:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "type": "message",
        "id": id,
        "role": "assistant",
        "status": "completed",
        "content": [part],
    }


def refusal_item(refusal: str, *, id: str = "msg_1") -> Json:
    part = {"type": "refusal", "refusal": refusal}
    return {
        "type": "message",
        "id": id,
        "role": "assistant",
        "status": "completed",
        "content": [part],
    }


def call_item(call_id: str, name: str, arguments: Mapping[str, Any] | str) -> Json:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": raw,
        "status": "completed",
    }


def reasoning_item() -> Json:
    return {"type": "reasoning", "id": "rs_1", "summary": []}


def response(
    output: Sequence[Json],
    *,
    status: str = "completed",
    usage: Json | None = RESPONSES_USAGE,
    incomplete: str | None = None,
    error: Json | None = None,
) -> Response:
    """A ``Response`` of the openai SDK."""
    return Response.model_validate(
        {
            "id": "resp_1",
            "created_at": 0,
            "model": "gpt-x",
            "object": "response",
            "output": list(output),
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "status": status,
            "usage": usage,
            "error": error,
            "incomplete_details": None if incomplete is None else {"reason": incomplete},
        }
    )


def responses_events(final: Response, *, piece: int = 4) -> list[BaseModel]:
    """The stream a server sends for ``final``: created, then each output item (text in
    deltas of ``piece`` characters, arguments in two halves), then the terminal event."""
    seq = iter(range(10_000))
    started = final.model_copy(update={"status": "in_progress", "output": [], "usage": None})
    events: list[Json] = [{"type": "response.created", "response": started.model_dump()}]
    for index, item in enumerate(final.output):
        data = item.model_dump(mode="json")
        events += _item_events(index, data, piece)
    terminal = {
        "completed": "response.completed",
        "incomplete": "response.incomplete",
        "failed": "response.failed",
    }[final.status or "completed"]
    events.append({"type": terminal, "response": final.model_dump(mode="json")})
    return [responses_event({**e, "sequence_number": next(seq)}) for e in events]


def _item_events(index: int, item: Json, piece: int) -> list[Json]:
    head = {"output_index": index, "item_id": item.get("id", "")}
    out: list[Json] = [
        {
            "type": "response.output_item.added",
            "output_index": index,
            # As the API sends it: a function call's arguments arrive only as deltas.
            "item": {**item, "status": "in_progress"}
            | ({"arguments": ""} if item["type"] == "function_call" else {}),
        }
    ]
    if item["type"] == "message":
        for c, part in enumerate(item["content"]):
            out.append(
                {
                    "type": "response.content_part.added",
                    **head,
                    "content_index": c,
                    "part": {**part, "text": ""} if "text" in part else part,
                }
            )
            if part["type"] == "output_text":
                text = part["text"]
                for start in range(0, len(text), piece):
                    out.append(
                        {
                            "type": "response.output_text.delta",
                            **head,
                            "content_index": c,
                            "delta": text[start : start + piece],
                            "logprobs": [],
                        }
                    )
                out.append(
                    {
                        "type": "response.output_text.done",
                        **head,
                        "content_index": c,
                        "text": text,
                        "logprobs": [],
                    }
                )
            else:
                out.append(
                    {
                        "type": "response.refusal.delta",
                        **head,
                        "content_index": c,
                        "delta": part["refusal"],
                    }
                )
            out.append(
                {"type": "response.content_part.done", **head, "content_index": c, "part": part}
            )
    elif item["type"] == "function_call":
        half = len(item["arguments"]) // 2
        for chunk in (item["arguments"][:half], item["arguments"][half:]):
            out.append({"type": "response.function_call_arguments.delta", **head, "delta": chunk})
        out.append(
            {
                "type": "response.function_call_arguments.done",
                **head,
                "arguments": item["arguments"],
                "name": item["name"],
            }
        )
    out.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return out


# -- Anthropic Messages --------------------------------------------------------------------

ANTHROPIC_USAGE: Json = {
    "input_tokens": 25,
    "output_tokens": 9,
    "cache_read_input_tokens": 100,
    "cache_creation_input_tokens": 5,
}


def anthropic_message(
    content: Sequence[Json], *, stop_reason: str = "end_turn", usage: Json = ANTHROPIC_USAGE
) -> AnthropicMessage:
    """A ``Message`` of the anthropic SDK."""
    return AnthropicMessage.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-x",
            "content": list(content),
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }
    )


def text_block(text: str) -> Json:
    return {"type": "text", "text": text, "citations": None}


def tool_use_block(id: str, name: str, arguments: Mapping[str, Any]) -> Json:
    return {"type": "tool_use", "id": id, "name": name, "input": dict(arguments)}


def anthropic_events(final: AnthropicMessage, *, piece: int = 4) -> list[BaseModel | Json]:
    """The stream a server sends for ``final``: message_start, a ping, each block (text in
    deltas of ``piece`` characters, tool input in two halves), message_delta, message_stop."""
    usage = final.usage.model_dump(mode="json")
    start = final.model_dump(mode="json") | {
        "content": [],
        "stop_reason": None,
        "usage": usage | {"output_tokens": 1},
    }
    events: list[Json] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(final.content):
        data = block.model_dump(mode="json")
        events += _block_events(index, data, piece)
        if index == 0:
            events.append({"type": "ping"})
    delta = {"stop_reason": final.stop_reason, "stop_sequence": None}
    events.append(
        {
            "type": "message_delta",
            "delta": delta,
            "usage": {"output_tokens": final.usage.output_tokens},
        }
    )
    events.append({"type": "message_stop"})
    return [
        e if e["type"] == "ping" else ANTHROPIC_EVENTS[e["type"]].model_validate(e) for e in events
    ]


def _block_events(index: int, block: Json, piece: int) -> list[Json]:
    out: list[Json] = []
    if block["type"] == "text":
        out.append(
            {"type": "content_block_start", "index": index, "content_block": {**block, "text": ""}}
        )
        text = block["text"]
        for start in range(0, len(text), piece):
            out.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "text_delta", "text": text[start : start + piece]},
                }
            )
    else:
        out.append(
            {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}}
        )
        raw = json.dumps(block["input"])
        for chunk in (raw[: len(raw) // 2], raw[len(raw) // 2 :]):
            out.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": chunk},
                }
            )
    out.append({"type": "content_block_stop", "index": index})
    return out

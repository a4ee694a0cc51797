"""Responses API input items (the OpenAI Agents SDK's session items) <-> convoq messages.

One item is one message. User, system, developer and assistant messages become messages
of that role (text parts, images and files as attachments); a ``function_call`` becomes an
assistant message with a tool call; a ``function_call_output`` a tool message. Every
other item type becomes an assistant message (a tool message for ``*_output`` types) with
no text. Where the view does not rebuild the item exactly, the item is kept in
``Message.framework["openai-agents"]``, which no model wire sends, without the attachment
bytes the parts hold (:mod:`convoq.integrations._originals`), so items come back exactly
as they were added.

Messages convoq wrote itself (a convoq agent's turn) read as the items that say the same:
an assistant message with text and tool calls reads as a message item and one
``function_call`` item per call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from convoq.errors import InvalidMessageError
from convoq.integrations._originals import (
    Binary,
    checked_json,
    data_url,
    original_of,
    parse_data_url,
    with_original,
)
from convoq.messages import FilePart, ImagePart, Message, MessageRole, Part, TextPart, ToolCall

FRAMEWORK = "openai-agents"
_ROLES = {"user", "system", "developer", "assistant"}
_TEXT_TYPES = {"input_text", "output_text", "text"}


def item_to_message(item: Any) -> Message:
    """The message that stores ``item`` (raises InvalidMessageError before any I/O)."""
    if not isinstance(item, Mapping):
        raise InvalidMessageError(
            f"session items are Responses API input item dicts, not {type(item).__name__}",
            rule="type",
        )
    item = checked_json(dict(item), "a session item")
    view, binaries = _view(item)
    if message_to_items(view) == [item]:
        return view
    return with_original(view, item, framework=FRAMEWORK, binaries=binaries)


def message_to_items(message: Message) -> list[dict[str, Any]]:
    """The items a stored message reads as (one, unless convoq wrote it itself)."""
    original = original_of(message, framework=FRAMEWORK)
    if original is not None:
        return [original]
    content = message.content
    if message.role == MessageRole.TOOL:
        return [_tool_output(message.tool_call_id or "", content)]
    items: list[dict[str, Any]] = []
    if content or not message.tool_calls:
        items.append({"role": message.role.value, "content": _content(message.role, content)})
    items += [_function_call(call) for call in message.tool_calls]
    return items


def _view(item: dict[str, Any]) -> tuple[Message, list[Binary]]:
    kind, role, call_id = item.get("type"), item.get("role"), item.get("call_id")
    if kind == "function_call" and isinstance(call_id, str) and isinstance(item.get("name"), str):
        call = ToolCall(id=call_id, name=item["name"], arguments=_arguments(item.get("arguments")))
        return Message(role=MessageRole.ASSISTANT, tool_calls=[call]), []
    if isinstance(kind, str) and kind.endswith("_output") and isinstance(call_id, str):
        parts, binaries = _parts(item.get("output"), ("output",))
        return Message(role=MessageRole.TOOL, content=parts, tool_call_id=call_id), binaries
    if kind in (None, "message") and role in _ROLES:
        parts, binaries = _parts(item.get("content"), ("content",))
        return Message(role=MessageRole(role), content=parts), binaries
    return Message(role=MessageRole.ASSISTANT), []


def _parts(content: object, at: tuple[str | int, ...]) -> tuple[list[Part], list[Binary]]:
    if isinstance(content, str):
        return [TextPart(text=content)], []
    parts: list[Part] = []
    binaries: list[Binary] = []
    for index, block in enumerate(content if isinstance(content, list) else []):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind in _TEXT_TYPES and isinstance(block.get("text"), str):
            parts.append(TextPart(text=block["text"]))
        elif kind == "input_image" and (found := parse_data_url(block.get("image_url"))):
            options = {"detail": block["detail"]} if "detail" in block else {}
            parts.append(ImagePart(data=found[1], mime_type=found[0], provider_options=options))
            binaries.append(Binary((*at, index, "image_url"), len(parts) - 1, "data_url"))
        elif kind == "input_file" and (found := parse_data_url(block.get("file_data"))):
            name = block.get("filename")
            filename = name if isinstance(name, str) else None
            parts.append(FilePart(data=found[1], mime_type=found[0], filename=filename))
            binaries.append(Binary((*at, index, "file_data"), len(parts) - 1, "data_url"))
    return parts, binaries


def _arguments(raw: object) -> dict[str, Any]:
    try:
        decoded = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return {}
    return decoded if isinstance(decoded, dict) else {}


def _function_call(call: ToolCall) -> dict[str, Any]:
    arguments = json.dumps(call.arguments)
    return {"type": "function_call", "call_id": call.id, "name": call.name, "arguments": arguments}


def _tool_output(call_id: str, content: list[Part]) -> dict[str, Any]:
    output: Any = _content(MessageRole.TOOL, content)
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def _content(role: MessageRole, content: list[Part]) -> str | list[dict[str, Any]]:
    if len(content) == 1 and isinstance(content[0], TextPart):
        return content[0].text
    if role == MessageRole.ASSISTANT:
        return "".join(p.text for p in content if isinstance(p, TextPart))
    return [_block(part) for part in content]


def _block(part: Part) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "input_text", "text": part.text}
    if isinstance(part, ImagePart):
        url = data_url(part.mime_type, part.data)
        return {"type": "input_image", "image_url": url, **part.provider_options}
    block = {"type": "input_file", "file_data": data_url(part.mime_type, part.data)}
    return block | ({"filename": part.filename} if part.filename is not None else {})

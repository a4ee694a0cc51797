"""LangChain messages <-> convoq messages, one for one and without loss.

Human, AI, tool and system messages become convoq user, assistant, tool and system
messages: text, images and files (``data:`` URLs or base64 blocks) as parts, tool calls as
:class:`~convoq.messages.ToolCall`. Where that view does not rebuild the LangChain message
exactly (ids, metadata, usage, other message types), the message's ``message_to_dict``
form is kept in ``Message.framework["langchain"]``, which no model wire sends, without the
attachment bytes the parts hold (:mod:`convoq.integrations._originals`). Messages another
framework or a convoq agent wrote read as the LangChain messages that say the same.
"""

from __future__ import annotations

import base64
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)

from convoq.errors import InvalidMessageError
from convoq.integrations._originals import (
    Binary,
    JsonPath,
    checked_json,
    data_url,
    original_of,
    parse_base64,
    parse_data_url,
    with_original,
)
from convoq.messages import FilePart, ImagePart, Message, MessageRole, Part, TextPart, ToolCall

FRAMEWORK = "langchain"
_ROLES = {"human": MessageRole.USER, "ai": MessageRole.ASSISTANT, "tool": MessageRole.TOOL,
          "system": MessageRole.SYSTEM}  # fmt: skip


def to_convoq(message: BaseMessage) -> Message:
    """The convoq message that stores ``message`` (InvalidMessageError before any I/O)."""
    if not isinstance(message, BaseMessage):
        raise InvalidMessageError(
            f"a chat history stores langchain BaseMessage objects, not {type(message).__name__}",
            rule="type",
        )
    form = checked_json(message_to_dict(message), "a LangChain message")
    view, binaries = _view(form)
    if message_to_dict(from_convoq(view)) == form:
        return view
    return with_original(view, form, framework=FRAMEWORK, binaries=binaries)


def from_convoq(message: Message) -> BaseMessage:
    """The LangChain message a stored convoq message reads as."""
    original = original_of(message, framework=FRAMEWORK)
    if original is not None:
        return messages_from_dict([original])[0]
    content = _lc_content(message.content)
    if message.role == MessageRole.USER:
        return HumanMessage(content=content)
    if message.role == MessageRole.TOOL:
        return ToolMessage(content=content, tool_call_id=message.tool_call_id or "")
    if message.role in (MessageRole.SYSTEM, MessageRole.DEVELOPER):
        return SystemMessage(content=content)
    calls = [{"name": c.name, "args": c.arguments, "id": c.id} for c in message.tool_calls]
    return AIMessage(content=content, tool_calls=calls)


def _view(form: dict[str, Any]) -> tuple[Message, list[Binary]]:
    data = form["data"]
    role = _ROLES.get(form["type"], MessageRole.ASSISTANT)
    parts, binaries = _parts(data.get("content"), ("data", "content"))
    fields: dict[str, Any] = {}
    if role == MessageRole.TOOL and isinstance(data.get("tool_call_id"), str):
        fields["tool_call_id"] = data["tool_call_id"]
    if form["type"] == "ai":
        fields["tool_calls"] = [
            ToolCall(id=call.get("id") or "", name=call["name"], arguments=call.get("args") or {})
            for call in data.get("tool_calls") or []
        ]
    return Message(role=role, content=parts, **fields), binaries


def _parts(content: object, at: JsonPath) -> tuple[list[Part], list[Binary]]:
    if isinstance(content, str):
        return ([TextPart(text=content)] if content else []), []
    parts: list[Part] = []
    binaries: list[Binary] = []
    for index, block in enumerate(content if isinstance(content, list) else []):
        if isinstance(block, str):
            parts.append(TextPart(text=block))
        elif isinstance(block, dict) and block.get("type") == "text":
            if isinstance(block.get("text"), str):
                parts.append(TextPart(text=block["text"]))
        elif isinstance(block, dict):
            found = _binary(block, (*at, index))
            if found is not None:
                part, path, spelling = found
                parts.append(part)
                binaries.append(Binary(path, len(parts) - 1, spelling))
    return parts, binaries


def _binary(block: dict[str, Any], at: JsonPath) -> tuple[Part, JsonPath, Any] | None:
    """An image or file block's bytes as a part, where they sit and how they are spelled."""
    kind = block.get("type")
    if kind == "image_url":
        url = block.get("image_url")
        path = (*at, "image_url", "url") if isinstance(url, dict) else (*at, "image_url")
        found = parse_data_url(url.get("url") if isinstance(url, dict) else url)
        if found is None:
            return None
        detail = url.get("detail") if isinstance(url, dict) else None
        options = {"detail": detail} if detail is not None else {}
        return (
            ImagePart(data=found[1], mime_type=found[0], provider_options=options),
            path,
            "data_url",
        )
    if kind not in ("image", "file") or not isinstance(block.get("mime_type"), str):
        return None
    key = "base64" if "base64" in block else "data"
    data = parse_base64(block.get(key))
    if data is None or (key == "data" and block.get("source_type") != "base64"):
        return None
    mime = block["mime_type"]
    if kind == "image":
        return ImagePart(data=data, mime_type=mime), (*at, key), "base64"
    name = block.get("filename")
    filename = name if isinstance(name, str) else None
    return FilePart(data=data, mime_type=mime, filename=filename), (*at, key), "base64"


def _lc_content(content: list[Part]) -> str | list[str | dict[str, Any]]:
    if not content:
        return ""
    if len(content) == 1 and isinstance(content[0], TextPart):
        return content[0].text
    return [_lc_block(part) for part in content]


def _lc_block(part: Part) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImagePart):
        url = {"url": data_url(part.mime_type, part.data), **part.provider_options}
        return {"type": "image_url", "image_url": url}
    encoded = base64.b64encode(part.data).decode("ascii")
    block = {"type": "file", "source_type": "base64", "data": encoded, "mime_type": part.mime_type}
    return block | ({"filename": part.filename} if part.filename is not None else {})

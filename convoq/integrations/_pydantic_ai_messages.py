"""Pydantic AI messages <-> convoq messages, both ways without loss.

A Pydantic AI message becomes the convoq messages that say the same in convoq's terms (a
request's user prompt: one user message with its images and files; each tool return: a
tool message; a response: an assistant message with its text, tool calls and usage), so
convoq agents, the CLI and the gateway read such turns like any other. The first of them
also keeps the Pydantic AI message itself under ``framework["pydantic_ai"]["message"]``
(the rest are marked ``"same"``): thinking parts, system prompts, retries, timestamps and
provider details come back from it exactly. Attachment bytes are not copied there: the
user message's parts hold them (stored once, as blobs) and fill them back in, in order.
Messages without that record (turns of convoq agents) are translated from their fields.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    ToolCallPart,
    ToolReturnPart,
    UserContent,
    UserPromptPart,
)
from pydantic_ai.messages import (
    TextPart as PaiText,
)
from pydantic_ai.usage import RequestUsage

from convoq.messages import (
    Decision,
    FilePart,
    ImagePart,
    Message,
    MessageRole,
    Part,
    TextPart,
    ToolCall,
)
from convoq.usage import Usage

KEY = "pydantic_ai"
_SAME = {KEY: {"same": True}}


def is_journal_entry(message: Message) -> bool:
    """A tool result the journal kept before its response's tool returns were complete."""
    return bool(message.framework and "journal" in (message.framework.get(KEY) or {}))


# --- Pydantic AI -> convoq ---------------------------------------------------------------


def to_convoq(
    messages: list[ModelMessage], decisions: dict[str, Decision] | None = None
) -> list[Message]:
    """The convoq messages of ``messages``; ``decisions``: approvals to record on the tool
    results of the calls they decided (the audit trail)."""
    out: list[Message] = []
    for message in messages:
        if isinstance(message, ModelResponse):
            out.append(_response(message))
        else:
            out.extend(_request(message, decisions or {}))
    return out


def _record(message: ModelMessage) -> dict[str, Any]:
    data: dict[str, Any] = ModelMessagesTypeAdapter.dump_python([message], mode="json")[0]
    return data


def _response(message: ModelResponse) -> Message:
    text = [TextPart(text=p.content) for p in message.parts if isinstance(p, PaiText)]
    calls = [
        ToolCall(id=p.tool_call_id, name=p.tool_name, arguments=p.args_as_dict())
        for p in message.parts
        if isinstance(p, ToolCallPart)
    ]
    return Message(
        role=MessageRole.ASSISTANT,
        content=list(text),
        tool_calls=calls,
        usage=_usage(message.usage),
        finish_reason=message.finish_reason,
        framework={KEY: {"message": _record(message)}},
    )


def _usage(usage: RequestUsage) -> Usage:
    reasoning = usage.output_reasoning_tokens or usage.details.get("reasoning_tokens", 0)
    return Usage(
        requests=1,
        prompt_tokens=usage.input_tokens,
        completion_tokens=usage.output_tokens,
        total_tokens=usage.input_tokens + usage.output_tokens,
        cached_tokens=usage.cache_read_tokens,
        reasoning_tokens=reasoning,
    )


def _request(message: ModelRequest, decisions: dict[str, Decision]) -> list[Message]:
    record = _record(message)
    content: list[Part] = []
    tools: list[Message] = []
    for part, data in zip(message.parts, record["parts"], strict=True):
        if isinstance(part, UserPromptPart):
            content.extend(_user_parts(part, data))
        elif isinstance(part, ToolReturnPart):
            call = ToolCall(id=part.tool_call_id, name=part.tool_name)
            decision = decisions.get(part.tool_call_id)
            tools.append(Message.tool_result(call, part.model_response_str(), decision))
    out = ([Message(role=MessageRole.USER, content=content)] if content else []) + tools
    if not out:  # only parts convoq has no field for (system prompts, retry feedback)
        out = [Message(role=MessageRole.DEVELOPER)]
    out[0] = out[0].model_copy(update={"framework": {KEY: {"message": record}}})
    return [out[0]] + [m.model_copy(update={"framework": _SAME}) for m in out[1:]]


def _user_parts(part: UserPromptPart, data: dict[str, Any]) -> list[Part]:
    """The prompt's text, images and files; the record's copies of their bytes are
    emptied (the parts keep them)."""
    if isinstance(part.content, str):
        return [TextPart(text=part.content)]
    parts: list[Part] = []
    for item, item_data in zip(part.content, data["content"], strict=True):
        if isinstance(item, str):
            parts.append(TextPart(text=item))
        elif isinstance(item, BinaryContent):
            item_data["data"] = ""
            if item.is_image:
                parts.append(ImagePart(data=item.data, mime_type=item.media_type))
            else:
                parts.append(
                    FilePart(data=item.data, mime_type=item.media_type, filename=item.identifier)
                )
    return parts


# --- convoq -> Pydantic AI ---------------------------------------------------------------


def to_pydantic_ai(messages: list[Message]) -> list[ModelMessage]:
    """The Pydantic AI messages of ``messages`` (journal entries left out)."""
    out: list[ModelMessage] = []
    for message in messages:
        record = (message.framework or {}).get(KEY)
        if record is not None:
            if "message" in record:
                out.append(_restored(record["message"], message))
            continue
        converted = _translated(message)
        if converted is not None:
            out.append(converted)
    return out


def _restored(record: dict[str, Any], message: Message) -> ModelMessage:
    record = json.loads(json.dumps(record))  # a copy: the stored message stays as it is
    attachments = iter(message.attachments)
    for part in record["parts"] if record.get("kind") == "request" else []:
        if part.get("part_kind") == "user-prompt" and isinstance(part["content"], list):
            for item in part["content"]:
                if isinstance(item, dict) and item.get("kind") == "binary":
                    item["data"] = _base64(next(attachments).data)
    restored: ModelMessage = ModelMessagesTypeAdapter.validate_python([record])[0]
    return restored


def _base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _translated(message: Message) -> ModelMessage | None:
    """A message a convoq agent wrote, in Pydantic AI's terms."""
    if message.role == MessageRole.ASSISTANT:
        parts: list[Any] = [PaiText(content=message.text)] if message.text else []
        parts += [ToolCallPart(c.name, c.arguments, tool_call_id=c.id) for c in message.tool_calls]
        usage = message.usage or Usage()
        return ModelResponse(
            parts=parts,
            usage=RequestUsage(
                input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens
            ),
        )
    if message.role == MessageRole.TOOL:
        return ModelRequest(
            parts=[
                ToolReturnPart(
                    tool_name=message.name or "", content=message.text,
                    tool_call_id=message.tool_call_id or "",
                )
            ]
        )  # fmt: skip
    if message.role == MessageRole.USER:
        return ModelRequest(parts=[UserPromptPart(user_prompt(message))])
    if message.text:  # system and developer messages
        return ModelRequest(parts=[SystemPromptPart(message.text)])
    return None


def user_content(message: Message) -> list[UserContent]:
    """A convoq user message as a Pydantic AI user prompt."""
    content: list[UserContent] = []
    for part in message.content:
        if isinstance(part, TextPart):
            content.append(part.text)
        elif isinstance(part, ImagePart):
            content.append(BinaryContent(data=part.data, media_type=part.mime_type))
        else:
            content.append(
                BinaryContent(data=part.data, media_type=part.mime_type, identifier=part.filename)
            )
    return content


def user_prompt(message: Message) -> str | list[UserContent]:
    """The prompt of a user message: its text alone, or its parts in order."""
    content = user_content(message)
    return content[0] if len(content) == 1 and isinstance(content[0], str) else content

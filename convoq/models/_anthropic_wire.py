"""The Anthropic Messages request body, without I/O.

The body is that of API version :data:`API_VERSION` (sent as ``anthropic-version``).

convoq's neutral history maps onto it like this: the *leading* system and developer
messages (the instructions, a summary right after them) become the top-level ``system``
blocks, in order. A system or developer message later in the history (a typed output's
retry prompt, a framework's mid-conversation note) keeps its place as user-side text:
hoisted into ``system`` it would become a standing instruction of every later request,
and a retry would end with the rejected answer as an assistant prefill instead of the
correction. User messages carry ``text``, ``image`` (base64) and ``document`` blocks (PDFs
as base64, ``text/plain`` as text); an assistant message is its text and ``tool_use``
blocks; tool results are ``tool_result`` blocks of a user message. Consecutive messages of
one role are joined into one, their blocks in order, as the API wants (parallel tool
results in one user message, followed by the next user text or a later system message).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from convoq.errors import ModelError
from convoq.messages import FilePart, ImagePart, Message, MessageRole, TextPart
from convoq.model_settings import ModelSettings
from convoq.models._wire_common import Json, b64, merge_extra, refuse_settings
from convoq.models.base import ModelRequest, OutputSpec, ToolSpec

API_VERSION = "2023-06-01"
"""The one Messages API version convoq speaks: the ``anthropic-version`` header, and the
request fields :func:`build_body` sends are those this version takes."""
API = f"Anthropic Messages API (anthropic-version {API_VERSION})"
# Settings fields this version takes under the same name (besides max_tokens, stop and
# the tool choice, mapped below); seed it has no field for.
SAMPLING = ("temperature", "top_p")
MAX_TEMPERATURE = 1.0
OutputMode = Literal["tool", "native"]
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
OUTPUT_TOOL_DESCRIPTION = "Give your final answer by calling this tool: its input is the answer."


def build_body(
    model: str,
    request: ModelRequest,
    *,
    stream: bool,
    extra_body: Mapping[str, Any],
    max_tokens: int,
    output_mode: OutputMode,
) -> Json:
    """The JSON body of ``POST /v1/messages``."""
    settings = request.settings or ModelSettings()
    refuse_settings(settings, API, "seed")
    lead, turns = split_lead(request.messages)
    system = [block for block in (_text_block(m) for m in lead) if block["text"]]
    body: Json = {"model": model, "max_tokens": settings.max_tokens or max_tokens,
                  "messages": join_roles([wire_message(m) for m in turns])}  # fmt: skip
    if system:
        body["system"] = system
    body.update(_sampling(settings))
    tools = [_tool(t) for t in request.tools]
    choice = _tool_choice(settings)
    if request.output is not None:
        choice = _ask_for_output(body, tools, choice, request.output, output_mode)
    if tools:
        body["tools"] = tools
    if choice is not None:
        body["tool_choice"] = choice
    if settings.stop is not None:
        body["stop_sequences"] = settings.stop
    if stream:
        body["stream"] = True
    return merge_extra(body, extra_body, request)


def _ask_for_output(
    body: Json, tools: list[Json], choice: Json | None, output: OutputSpec, mode: OutputMode
) -> Json | None:
    """Ask for the typed output: natively (``output_config.format``), or (the default) as
    a tool the model must end with; returns the tool choice to send."""
    if mode == "native":
        body["output_config"] = {"format": {"type": "json_schema", "schema": output.json_schema}}
        return choice
    if any(t["name"] == output.name for t in tools):
        raise ModelError(
            f"the output name {output.name!r} is also a tool's name; rename one of them"
        )
    tools.append({"name": output.name, "description": OUTPUT_TOOL_DESCRIPTION,
                  "input_schema": output.json_schema})  # fmt: skip
    if choice is not None:
        return choice
    # Only the output tool: call it. With other tools: call one of them, or the output.
    return {"type": "tool", "name": output.name} if len(tools) == 1 else {"type": "any"}


def _tool(spec: ToolSpec) -> Json:
    tool: Json = {"name": spec.name, "input_schema": spec.parameters}
    if spec.description:
        tool["description"] = spec.description
    return tool


def _tool_choice(settings: ModelSettings) -> Json | None:
    choice = settings.tool_choice
    out: Json | None
    if choice is None:
        out = None if settings.parallel_tool_calls is None else {"type": "auto"}
    elif choice in ("auto", "none"):
        out = {"type": choice}
    elif choice == "required":
        out = {"type": "any"}
    else:
        out = {"type": "tool", "name": choice}
    if out is not None and settings.parallel_tool_calls is False and out["type"] != "none":
        out["disable_parallel_tool_use"] = True
    return out


def _sampling(settings: ModelSettings) -> Json:
    """``temperature`` and ``top_p`` as given; a temperature above what the API takes
    (0.0 to 1.0, where ModelSettings allows OpenAI's 2.0) is refused before sending."""
    if settings.temperature is not None and settings.temperature > MAX_TEMPERATURE:
        raise ModelError(
            f"the {API} takes a temperature from 0.0 to {MAX_TEMPERATURE}, not"
            f" {settings.temperature}; lower model_settings.temperature for this model"
        )
    values = {name: getattr(settings, name) for name in SAMPLING}
    return {name: value for name, value in values.items() if value is not None}


def _is_instruction(message: Message) -> bool:
    return message.role in (MessageRole.SYSTEM, MessageRole.DEVELOPER)


def split_lead(messages: list[Message]) -> tuple[list[Message], list[Message]]:
    """The leading run of system and developer messages (sent as ``system``), and the
    rest of the history, later system and developer messages in their places."""
    for index, message in enumerate(messages):
        if not _is_instruction(message):
            return messages[:index], messages[index:]
    return list(messages), []


def _text_block(message: Message) -> Json:
    if message.attachments:
        raise ModelError(
            f"a {message.role.value} message cannot carry images or files in the {API};"
            " put attachments in a user message"
        )
    return {"type": "text", "text": message.text}


def wire_message(message: Message) -> Json:
    """One message of the history after its leading system run as a Messages API message:
    a system or developer message there is user-side text (the API has no system role in
    ``messages``), joined with the user message beside it by :func:`join_roles`."""
    if _is_instruction(message):
        block = _text_block(message)
        return {"role": "user", "content": [block] if block["text"] else []}
    if message.role == MessageRole.TOOL:
        result = {"type": "tool_result", "tool_use_id": message.tool_call_id or "",
                  "content": message.text}  # fmt: skip
        return {"role": "user", "content": [result]}
    if message.role == MessageRole.ASSISTANT:
        blocks: list[Json] = []
        said = message.text or message.refusal
        if said:
            blocks.append({"type": "text", "text": said})
        for call in message.tool_calls:
            blocks.append({"type": "tool_use", "id": call.id, "name": call.name,
                           "input": call.arguments})  # fmt: skip
        return {"role": "assistant", "content": blocks}
    return {"role": "user", "content": [_block(p) for p in message.content if _kept(p)]}


def _kept(part: TextPart | ImagePart | FilePart) -> bool:
    return not isinstance(part, TextPart) or bool(part.text)  # the API refuses empty text


def _block(part: TextPart | ImagePart | FilePart) -> Json:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImagePart):
        if part.mime_type not in IMAGE_TYPES:
            raise ModelError(
                f"the {API} takes images of type {', '.join(IMAGE_TYPES)}, not"
                f" {part.mime_type!r}; convert the image first"
            )
        source = {"type": "base64", "media_type": part.mime_type, "data": b64(part)}
        return {"type": "image", "source": source}
    return _document(part)


def _document(part: FilePart) -> Json:
    if part.mime_type == "application/pdf":
        source = {"type": "base64", "media_type": "application/pdf", "data": b64(part)}
    elif part.mime_type == "text/plain":
        text = part.data.decode("utf-8", errors="replace")
        source = {"type": "text", "media_type": "text/plain", "data": text}
    else:
        raise ModelError(
            f"the {API} takes PDF and plain-text files, not {part.mime_type!r}"
            f" ({part.filename or 'unnamed file'}); convert it or send it as text"
        )
    block: Json = {"type": "document", "source": source}
    if part.filename:
        block["title"] = part.filename
    return block


def join_roles(messages: list[Json]) -> list[Json]:
    """Consecutive messages of one role as one; messages left without content dropped."""
    joined: list[Json] = []
    for message in messages:
        if not message["content"]:
            continue
        if joined and joined[-1]["role"] == message["role"]:
            joined[-1]["content"] = [*joined[-1]["content"], *message["content"]]
        else:
            joined.append({"role": message["role"], "content": list(message["content"])})
    return joined

"""An MCP tool result as a convoq tool result.

Text blocks become the result's text, in order. Images (and embedded image resources)
become :class:`~convoq.messages.ImagePart` attachments of the tool result message, other
binary content (audio, blobs) :class:`~convoq.messages.FilePart` attachments, each with a
line in the text saying it is attached, so a model API that takes only text in tool
results (Chat Completions) still learns of it. Structured content is given as its JSON
when the result has no text block (servers should send it as text too). ``isError``
results read ``Error: <the server's text>`` (the server chose its words, as a Python tool
raising ``ToolFailure`` does; there is no exception type to name) and are what the engine
reports like a tool that raised: logged by ``convoq.tools`` with the call's ids, counted in
``convoq_tool_errors_total``. A call convoq could not make raises ``ToolError``, which the
model reads as ``Error: ToolError: ...``, as for any tool.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import mcp.types as mt

from convoq.messages import FilePart, ImagePart
from convoq.tools import ToolOutput

MAX_ATTACHMENT_BYTES = 8 * 1024 * 1024
"""Past this an attachment from an MCP result is left out (and the text says so)."""


def tool_output(result: mt.CallToolResult) -> ToolOutput:
    """The tool result convoq stores for ``result``."""
    lines: list[str] = []
    attachments: list[ImagePart | FilePart] = []
    for block in result.content:
        _add(block, lines, attachments)
    has_text = any(isinstance(b, mt.TextContent) for b in result.content)
    if result.structured_content is not None and not has_text:
        # Servers should send the JSON as text as well; this one did not.
        lines.append(json.dumps(result.structured_content, separators=(",", ":")))
    text = "\n".join(lines)
    if result.is_error:
        text = f"Error: {text or 'the tool reported an error'}"
    return ToolOutput(text, attachments, is_error=bool(result.is_error))


def _add(block: Any, lines: list[str], attachments: list[ImagePart | FilePart]) -> None:
    if isinstance(block, mt.TextContent):
        lines.append(block.text)
    elif isinstance(block, mt.ImageContent | mt.AudioContent):
        _attach(block.data, block.mime_type, None, lines, attachments)
    elif isinstance(block, mt.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, mt.TextResourceContents):
            lines.append(resource.text)
        else:
            mime = resource.mime_type or "application/octet-stream"
            _attach(resource.blob, mime, str(resource.uri), lines, attachments)
    elif isinstance(block, mt.ResourceLink):
        lines.append(f"[resource {block.name}: {block.uri}]")
    else:
        lines.append(f"[content of type {getattr(block, 'type', '?')!r} left out]")


def _attach(
    data: str,
    mime: str,
    uri: str | None,
    lines: list[str],
    attachments: list[ImagePart | FilePart],
) -> None:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        lines.append(f"[{mime} content left out: not valid base64]")
        return
    if len(raw) > MAX_ATTACHMENT_BYTES:
        lines.append(f"[{mime} content of {len(raw)} bytes left out: over {MAX_ATTACHMENT_BYTES}]")
        return
    if mime.startswith("image/"):
        attachments.append(ImagePart(data=raw, mime_type=mime))
        lines.append(f"[image {mime}, {len(raw)} bytes, attached]")
    else:
        name = uri.rsplit("/", 1)[-1] if uri else None
        attachments.append(FilePart(data=raw, mime_type=mime, filename=name or None))
        lines.append(f"[file {mime}, {len(raw)} bytes, attached]")

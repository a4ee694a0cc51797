"""How an MCP tool result becomes a convoq tool result (no server needed)."""

from __future__ import annotations

import base64

import mcp.types as mt
import pytest

from convoq.mcp import _results
from convoq.mcp._results import tool_output
from convoq.messages import FilePart, ImagePart


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_text_images_audio_and_resources_in_order() -> None:
    result = mt.CallToolResult(
        content=[
            mt.TextContent(type="text", text="caption"),
            mt.ImageContent(type="image", data=_b64(b"\x89PNG"), mime_type="image/png"),
            mt.AudioContent(type="audio", data=_b64(b"RIFF"), mime_type="audio/wav"),
            mt.EmbeddedResource(
                type="resource",
                resource=mt.BlobResourceContents(
                    uri="file:///r/report.pdf", mime_type="application/pdf", blob=_b64(b"%PDF")
                ),
            ),
            mt.EmbeddedResource(
                type="resource",
                resource=mt.TextResourceContents(uri="file:///r/a.txt", text="inline text"),
            ),
            mt.ResourceLink(type="resource_link", name="big", uri="file:///r/big.bin"),
        ]
    )
    out = tool_output(result)
    assert out.text.splitlines() == [
        "caption",
        "[image image/png, 4 bytes, attached]",
        "[file audio/wav, 4 bytes, attached]",
        "[file application/pdf, 4 bytes, attached]",
        "inline text",
        "[resource big: file:///r/big.bin]",
    ]
    image, audio, pdf = out.attachments
    assert isinstance(image, ImagePart) and image.data == b"\x89PNG"
    assert isinstance(audio, FilePart) and audio.mime_type == "audio/wav"
    assert isinstance(pdf, FilePart) and (pdf.filename, pdf.data) == ("report.pdf", b"%PDF")
    assert not out.is_error


def test_structured_content_alone_is_given_as_json() -> None:
    out = tool_output(mt.CallToolResult(content=[], structured_content={"temp": 21}))
    assert out.text == '{"temp":21}'


def test_structured_content_beside_text_leaves_the_text_as_it_is() -> None:
    result = mt.CallToolResult(
        content=[mt.TextContent(type="text", text="21 degrees")], structured_content={"temp": 21}
    )
    assert tool_output(result).text == "21 degrees"


def test_an_error_result_reads_error() -> None:
    result = mt.CallToolResult(
        content=[mt.TextContent(type="text", text="no such city")], is_error=True
    )
    out = tool_output(result)
    assert (out.text, out.is_error) == ("Error: no such city", True)
    assert tool_output(mt.CallToolResult(content=[], is_error=True)).text == (
        "Error: the tool reported an error"
    )


def test_oversize_or_broken_binary_content_is_left_out_and_said_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_results, "MAX_ATTACHMENT_BYTES", 3)
    result = mt.CallToolResult(
        content=[
            mt.ImageContent(type="image", data=_b64(b"1234"), mime_type="image/png"),
            mt.ImageContent(type="image", data="not base64!", mime_type="image/png"),
        ]
    )
    out = tool_output(result)
    assert out.attachments == []
    assert out.text.splitlines() == [
        "[image/png content of 4 bytes left out: over 3]",
        "[image/png content left out: not valid base64]",
    ]

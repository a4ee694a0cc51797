"""What the integration tests store: attachment bytes and Responses API items of every kind."""

from __future__ import annotations

import base64
from typing import Any

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
PDF = b"%PDF-1.7\n" + bytes(range(255, -1, -1)) * 3
B64_PNG = base64.b64encode(PNG).decode()


def url_of(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def every_kind_of_item() -> list[dict[str, Any]]:
    """Items as the SDK saves them (ids, statuses, annotations), as users write them, and
    types convoq has no counterpart for."""
    return [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": "What is in this picture and this file?"},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": url_of("image/png", PNG), "detail": "low"},
                {
                    "type": "input_file",
                    "file_data": url_of("application/pdf", PDF),
                    "filename": "report.pdf",
                },
                {
                    "type": "input_image",
                    "image_url": "https://example.com/cat.png",
                    "detail": "auto",
                },
            ],
        },
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}]},
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "lookup",
            "arguments": '{"q":"cat","n":2}',
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "a tabby cat"},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "Un chat.", "annotations": [], "logprobs": []}
            ],
        },
        {
            "type": "web_search_call",
            "id": "ws_1",
            "status": "completed",
            "action": {"type": "search", "query": "cats"},
        },
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": [
                {"type": "input_text", "text": "ok"},
                {"type": "input_image", "image_url": url_of("image/png", PNG), "detail": "auto"},
            ],
        },
        {"role": "user", "content": 'Merci, unicode ✓ \u00e9 and "quotes"'},
        {"role": "user", "content": ""},
        {"role": "user", "content": []},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot."}]},
    ]

"""Messages as convoq stored them before ``Message.framework`` held what only a framework
needs: the framework's JSON rode along as a last file part of type
``application/vnd.convoq.original+json``. :data:`STORED` is what the LangChain and OpenAI
Agents integrations of that version stored for :func:`langchain_messages` and
:func:`agents_items` (their JSON, captured from that version's ``messages_to_json``)."""

from __future__ import annotations

import base64
import json
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from convoq.messages import FilePart, Message

PNG = b"\x89PNG\r\n\x1a\nlegacy-png"
PDF = b"%PDF-1.4 legacy-pdf"
LEGACY_MIME = "application/vnd.convoq.original+json"

STORED = (
    '[{"role":"user","content":[{"type":"text","text":"legacy langchain question"},{"type'
    '":"image","data":"iVBORw0KGgpsZWdhY3ktcG5n","mime_type":"image/png","provider_option'
    's":{}},{"type":"file","data":"JVBERi0xLjQgbGVnYWN5LXBkZg==","mime_type":"application'
    '/pdf","filename":"legacy.pdf","provider_options":{}},{"type":"file","data":"eyJmcmFt'
    "ZXdvcmsiOiJsYW5nY2hhaW4iLCJ2ZXJzaW9uIjoxLCJvcmlnaW5hbCI6eyJ0eXBlIjoiaHVtYW4iLCJkYXRh"
    "Ijp7ImNvbnRlbnQiOlt7InR5cGUiOiJ0ZXh0IiwidGV4dCI6ImxlZ2FjeSBsYW5nY2hhaW4gcXVlc3Rpb24i"
    "fSx7InR5cGUiOiJpbWFnZV91cmwiLCJpbWFnZV91cmwiOnsidXJsIjpudWxsfX0seyJ0eXBlIjoiZmlsZSIs"
    "InNvdXJjZV90eXBlIjoiYmFzZTY0IiwibWltZV90eXBlIjoiYXBwbGljYXRpb24vcGRmIiwiZGF0YSI6bnVs"
    "bCwiZmlsZW5hbWUiOiJsZWdhY3kucGRmIn1dLCJhZGRpdGlvbmFsX2t3YXJncyI6e30sInJlc3BvbnNlX21l"
    "dGFkYXRhIjp7fSwidHlwZSI6Imh1bWFuIiwibmFtZSI6bnVsbCwiaWQiOiJsYy1oLTEifX0sImJpbmFyaWVz"
    "IjpbW1siZGF0YSIsImNvbnRlbnQiLDEsImltYWdlX3VybCIsInVybCJdLDEsImRhdGFfdXJsIl0sW1siZGF0"
    'YSIsImNvbnRlbnQiLDIsImRhdGEiXSwyLCJiYXNlNjQiXV19","mime_type":"application/vnd.convo'
    'q.original+json","filename":null,"provider_options":{}}],"tool_calls":[],"tool_call_'
    'id":null,"name":null},{"role":"assistant","content":[{"type":"file","data":"eyJmcmFt'
    "ZXdvcmsiOiJsYW5nY2hhaW4iLCJ2ZXJzaW9uIjoxLCJvcmlnaW5hbCI6eyJ0eXBlIjoiYWkiLCJkYXRhIjp7"
    "ImNvbnRlbnQiOiIiLCJhZGRpdGlvbmFsX2t3YXJncyI6e30sInJlc3BvbnNlX21ldGFkYXRhIjp7fSwidHlw"
    "ZSI6ImFpIiwibmFtZSI6bnVsbCwiaWQiOiJsYy1haS0xIiwidG9vbF9jYWxscyI6W3sibmFtZSI6Imxvb2t1"
    "cCIsImFyZ3MiOnsicSI6ImxlZ2FjeSJ9LCJpZCI6ImxjLWNhbGwtMSIsInR5cGUiOiJ0b29sX2NhbGwifV0s"
    "ImludmFsaWRfdG9vbF9jYWxscyI6W10sInVzYWdlX21ldGFkYXRhIjpudWxsfX0sImJpbmFyaWVzIjpbXX0="
    '","mime_type":"application/vnd.convoq.original+json","filename":null,"provider_optio'
    'ns":{}}],"tool_calls":[{"id":"lc-call-1","name":"lookup","arguments":{"q":"legacy"}}'
    '],"tool_call_id":null,"name":null},{"role":"tool","content":[{"type":"text","text":"'
    'legacy result"},{"type":"file","data":"eyJmcmFtZXdvcmsiOiJsYW5nY2hhaW4iLCJ2ZXJzaW9uI'
    "joxLCJvcmlnaW5hbCI6eyJ0eXBlIjoidG9vbCIsImRhdGEiOnsiY29udGVudCI6ImxlZ2FjeSByZXN1bHQiL"
    "CJhZGRpdGlvbmFsX2t3YXJncyI6e30sInJlc3BvbnNlX21ldGFkYXRhIjp7fSwidHlwZSI6InRvb2wiLCJuY"
    "W1lIjpudWxsLCJpZCI6ImxjLXQtMSIsInRvb2xfY2FsbF9pZCI6ImxjLWNhbGwtMSIsImFydGlmYWN0Ijpud"
    'WxsLCJzdGF0dXMiOiJzdWNjZXNzIn19LCJiaW5hcmllcyI6W119","mime_type":"application/vnd.co'
    'nvoq.original+json","filename":null,"provider_options":{}}],"tool_calls":[],"tool_ca'
    'll_id":"lc-call-1","name":null},{"role":"assistant","content":[{"type":"text","text"'
    ':"legacy langchain answer"},{"type":"file","data":"eyJmcmFtZXdvcmsiOiJsYW5nY2hhaW4iL'
    "CJ2ZXJzaW9uIjoxLCJvcmlnaW5hbCI6eyJ0eXBlIjoiYWkiLCJkYXRhIjp7ImNvbnRlbnQiOiJsZWdhY3kgb"
    "GFuZ2NoYWluIGFuc3dlciIsImFkZGl0aW9uYWxfa3dhcmdzIjp7fSwicmVzcG9uc2VfbWV0YWRhdGEiOnsib"
    "W9kZWxfbmFtZSI6ImZha2UifSwidHlwZSI6ImFpIiwibmFtZSI6bnVsbCwiaWQiOiJsYy1haS0yIiwidG9vb"
    "F9jYWxscyI6W10sImludmFsaWRfdG9vbF9jYWxscyI6W10sInVzYWdlX21ldGFkYXRhIjpudWxsfX0sImJpb"
    'mFyaWVzIjpbXX0=","mime_type":"application/vnd.convoq.original+json","filename":null,'
    '"provider_options":{}}],"tool_calls":[],"tool_call_id":null,"name":null},{"role":"us'
    'er","content":[{"type":"text","text":"legacy agents question"},{"type":"image","data'
    '":"iVBORw0KGgpsZWdhY3ktcG5n","mime_type":"image/png","provider_options":{"detail":"l'
    'ow"}},{"type":"file","data":"JVBERi0xLjQgbGVnYWN5LXBkZg==","mime_type":"application/'
    'pdf","filename":"legacy.pdf","provider_options":{}},{"type":"file","data":"eyJmcmFtZ'
    "XdvcmsiOiJvcGVuYWktYWdlbnRzIiwidmVyc2lvbiI6MSwib3JpZ2luYWwiOnsidHlwZSI6Im1lc3NhZ2UiL"
    "CJyb2xlIjoidXNlciIsImNvbnRlbnQiOlt7InR5cGUiOiJpbnB1dF90ZXh0IiwidGV4dCI6ImxlZ2FjeSBhZ"
    "2VudHMgcXVlc3Rpb24ifSx7InR5cGUiOiJpbnB1dF9pbWFnZSIsImltYWdlX3VybCI6bnVsbCwiZGV0YWlsI"
    "joibG93In0seyJ0eXBlIjoiaW5wdXRfZmlsZSIsImZpbGVfZGF0YSI6bnVsbCwiZmlsZW5hbWUiOiJsZWdhY"
    "3kucGRmIn1dfSwiYmluYXJpZXMiOltbWyJjb250ZW50IiwxLCJpbWFnZV91cmwiXSwxLCJkYXRhX3VybCJdL"
    'FtbImNvbnRlbnQiLDIsImZpbGVfZGF0YSJdLDIsImRhdGFfdXJsIl1dfQ==","mime_type":"applicatio'
    'n/vnd.convoq.original+json","filename":null,"provider_options":{}}],"tool_calls":[],'
    '"tool_call_id":null,"name":null},{"role":"assistant","content":[{"type":"file","data'
    '":"eyJmcmFtZXdvcmsiOiJvcGVuYWktYWdlbnRzIiwidmVyc2lvbiI6MSwib3JpZ2luYWwiOnsidHlwZSI6I'
    "mZ1bmN0aW9uX2NhbGwiLCJpZCI6ImZjXzEiLCJjYWxsX2lkIjoib2EtY2FsbC0xIiwibmFtZSI6Imxvb2t1c"
    "CIsImFyZ3VtZW50cyI6IntcInFcIjogXCJsZWdhY3lcIn0iLCJzdGF0dXMiOiJjb21wbGV0ZWQifSwiYmluY"
    'XJpZXMiOltdfQ==","mime_type":"application/vnd.convoq.original+json","filename":null,'
    '"provider_options":{}}],"tool_calls":[{"id":"oa-call-1","name":"lookup","arguments":'
    '{"q":"legacy"}}],"tool_call_id":null,"name":null},{"role":"tool","content":[{"type":'
    '"text","text":"legacy result"}],"tool_calls":[],"tool_call_id":"oa-call-1","name":nu'
    'll},{"role":"assistant","content":[{"type":"text","text":"legacy agents answer"},{"t'
    'ype":"file","data":"eyJmcmFtZXdvcmsiOiJvcGVuYWktYWdlbnRzIiwidmVyc2lvbiI6MSwib3JpZ2lu'
    "YWwiOnsiaWQiOiJtc2dfMSIsInR5cGUiOiJtZXNzYWdlIiwicm9sZSI6ImFzc2lzdGFudCIsInN0YXR1cyI6"
    "ImNvbXBsZXRlZCIsImNvbnRlbnQiOlt7InR5cGUiOiJvdXRwdXRfdGV4dCIsInRleHQiOiJsZWdhY3kgYWdl"
    'bnRzIGFuc3dlciIsImFubm90YXRpb25zIjpbXSwibG9ncHJvYnMiOltdfV19LCJiaW5hcmllcyI6W119","m'
    'ime_type":"application/vnd.convoq.original+json","filename":null,"provider_options":'
    '{}}],"tool_calls":[],"tool_call_id":null,"name":null}]'
)


def _url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def langchain_messages() -> list[BaseMessage]:
    """What LangChain wrote: the first four stored messages."""
    return [
        HumanMessage(
            content=[
                {"type": "text", "text": "legacy langchain question"},
                {"type": "image_url", "image_url": {"url": _url("image/png", PNG)}},
                {
                    "type": "file",
                    "source_type": "base64",
                    "mime_type": "application/pdf",
                    "data": base64.b64encode(PDF).decode(),
                    "filename": "legacy.pdf",
                },
            ],
            id="lc-h-1",
        ),
        AIMessage(
            "",
            tool_calls=[{"name": "lookup", "args": {"q": "legacy"}, "id": "lc-call-1"}],
            id="lc-ai-1",
        ),
        ToolMessage("legacy result", tool_call_id="lc-call-1", id="lc-t-1"),
        AIMessage(
            "legacy langchain answer", id="lc-ai-2", response_metadata={"model_name": "fake"}
        ),
    ]


def agents_items() -> list[dict[str, Any]]:
    """What the OpenAI Agents SDK wrote: the last four stored messages."""
    return [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "legacy agents question"},
                {"type": "input_image", "image_url": _url("image/png", PNG), "detail": "low"},
                {
                    "type": "input_file",
                    "file_data": _url("application/pdf", PDF),
                    "filename": "legacy.pdf",
                },
            ],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "oa-call-1",
            "name": "lookup",
            "arguments": '{"q": "legacy"}',
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "oa-call-1", "output": "legacy result"},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [
                {
                    "type": "output_text",
                    "text": "legacy agents answer",
                    "annotations": [],
                    "logprobs": [],
                }
            ],
        },
    ]


def stored_messages() -> list[Message]:
    """:data:`STORED` as message objects in the old form, the record part left in place
    (built without validation, which now moves it), ready to be appended as they were."""
    out: list[Message] = []
    for raw in json.loads(STORED):
        parts = raw["content"]
        legacy = parts[-1] if parts and parts[-1].get("mime_type") == LEGACY_MIME else None
        if legacy is None:
            out.append(Message.model_validate_json(json.dumps(raw)))
            continue
        view = Message.model_validate_json(json.dumps({**raw, "content": parts[:-1]}))
        part = FilePart.model_validate_json(json.dumps(legacy))
        out.append(view.model_copy(update={"content": [*view.content, part]}))
    return out

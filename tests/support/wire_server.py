"""One loopback server speaking all three model wires, answering by rule instead of by queue.

Chat Completions at ``/v1/chat/completions``, Responses at ``/v1/responses`` and Anthropic
Messages at ``/v1/messages``: point ``openai(base_url=server.url)``,
``responses(base_url=server.url)`` or ``anthropic(base_url=server.root)`` at it (or the
same framework models of Pydantic AI). Each request is read into a wire-neutral
:class:`Seen` (the conversation as the model was sent it), handed to the ``script`` given,
and its :class:`Said` is written back in the wire the request came in, as JSON or as the
SSE stream the request asked for. Answers come from the request alone, so many
conversations on many workers can share one server at once; every request is recorded for
the test to read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support import sdk_wire as w
from tests.support.openai_server import OpenAIServer, RecordedRequest, _Reply

Json = dict[str, Any]


@dataclass
class Item:
    """One entry of the conversation a model was sent, in order."""

    role: str  # system | user | assistant | tool
    text: str = ""
    calls: list[tuple[str, str, Json]] = field(default_factory=list)  # id, name, arguments
    call_id: str | None = None  # a tool result's call


@dataclass
class Seen:
    """A request, wire-neutral."""

    wire: str  # chat | responses | anthropic
    body: Json
    system: list[str]  # what the wire's own system slot carries (instructions, system)
    items: list[Item]
    tools: list[str]
    structured: bool  # asked for an answer matching a JSON schema (natively or by a tool)
    output_tool: str | None = None  # the tool a typed answer is given through, if any

    def since(self, marker: str) -> tuple[Item | None, list[Item]]:
        """The last item whose text holds ``marker``, and the items after it."""
        for index in range(len(self.items) - 1, -1, -1):
            if marker in self.items[index].text:
                return self.items[index], self.items[index + 1 :]
        return None, []


@dataclass
class Said:
    """A model's answer: text, tool calls, or both; or a typed ``output``, given the way
    the request asked for it (its output tool, else JSON text); or, with ``error``, that
    HTTP status and the wire's error body instead (a request the API refuses)."""

    text: str = ""
    calls: list[tuple[str, str, Json]] = field(default_factory=list)
    output: Any = None
    error: int | None = None


Script = Callable[[Seen], Said]


class WireServer(OpenAIServer):
    """A three-wire server whose answers ``script`` computes from each request."""

    def __init__(self, script: Script) -> None:
        super().__init__()
        self._script = script

    @property
    def root(self) -> str:
        """The base URL without ``/v1`` (what Anthropic clients take)."""
        return self.url.removesuffix("/v1")

    def seen(self) -> list[Seen]:
        """Every request so far, read as :class:`Seen`."""
        with self._lock:
            recorded = list(self.requests)
        return [read(r) for r in recorded]

    def _record(self, request: RecordedRequest) -> _Reply:
        with self._lock:
            self.requests.append(request)
        seen = read(request)
        said = self._script(seen)
        if said.output is not None:
            if seen.output_tool:
                said.calls = [*said.calls, ("call_out", seen.output_tool, said.output)]
            else:
                said.text = json.dumps(said.output)
        return _render(seen, said)


# Pydantic AI asks for a typed answer through a tool of this name (its default output mode).
FINAL_RESULT = "final_result"


def read(request: RecordedRequest) -> Seen:
    body: Json = request.json
    if request.path.endswith("/messages"):
        seen = _read_anthropic(body)
    elif request.path.endswith("/responses"):
        seen = _read_responses(body)
    else:
        seen = _read_chat(body)
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "tool":
        seen.output_tool = choice["name"]  # Anthropic: convoq's output tool, forced
    elif FINAL_RESULT in seen.tools:
        seen.output_tool = FINAL_RESULT
    elif seen.wire == "anthropic" and choice == {"type": "any"} and seen.tools:
        seen.output_tool = seen.tools[-1]  # convoq's output tool comes after the others
    seen.structured = seen.structured or seen.output_tool is not None
    return seen


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for part in content or []:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part, dict) and part.get("type") == "tool_result":
            texts.append(_text_of(part.get("content")))
    return "\n".join(texts)


def _read_chat(body: Json) -> Seen:
    items, system = [], []
    for m in body.get("messages", []):
        role = m["role"]
        if role in ("system", "developer"):
            role = "system"
        calls = [
            (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
            for c in m.get("tool_calls") or []
        ]
        items.append(Item(role, _text_of(m.get("content")), calls, m.get("tool_call_id")))
    tools = [t["function"]["name"] for t in body.get("tools") or []]
    structured = (body.get("response_format") or {}).get("type") == "json_schema"
    return Seen("chat", body, system, items, tools, structured)


def _read_responses(body: Json) -> Seen:
    system = [body["instructions"]] if body.get("instructions") else []
    items: list[Item] = []
    for entry in body.get("input") or []:
        kind = entry.get("type", "message")
        if kind == "function_call":
            args = json.loads(entry.get("arguments") or "{}")
            items.append(Item("assistant", calls=[(entry["call_id"], entry["name"], args)]))
        elif kind == "function_call_output":
            items.append(Item("tool", _text_of(entry.get("output")), call_id=entry["call_id"]))
        else:
            role = "system" if entry["role"] in ("system", "developer") else entry["role"]
            items.append(Item(role, _text_of(entry.get("content"))))
    tools = [t.get("name", "") for t in body.get("tools") or []]
    structured = ((body.get("text") or {}).get("format") or {}).get("type") == "json_schema"
    return Seen("responses", body, system, items, tools, structured)


def _read_anthropic(body: Json) -> Seen:
    raw = body.get("system")
    system = [raw] if isinstance(raw, str) else [b["text"] for b in raw or []]
    items: list[Item] = []
    for m in body.get("messages", []):
        content = m["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        texts = [b["text"] for b in blocks if b.get("type") == "text"]
        results = [b for b in blocks if b.get("type") == "tool_result"]
        calls = [(b["id"], b["name"], b["input"]) for b in blocks if b.get("type") == "tool_use"]
        for result in results:
            items.append(
                Item("tool", _text_of(result.get("content")), call_id=result["tool_use_id"])
            )
        if texts or calls:
            items.append(Item(m["role"], "\n".join(texts), calls))
    tools = [t["name"] for t in body.get("tools") or []]
    structured = bool(body.get("output_config"))
    return Seen("anthropic", body, system, items, tools, structured)


def _render(seen: Seen, said: Said) -> _Reply:
    if said.error is not None:
        return _refused(seen, said.error, said.text or "refused by the test's script")
    stream = bool(seen.body.get("stream"))
    if seen.wire == "chat":
        message: Json = {"role": "assistant", "content": said.text or None}
        if said.calls:
            message["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                for i, n, a in said.calls
            ]
        finish = "tool_calls" if said.calls else "stop"
        return _Reply(message=message, finish_reason=finish)
    if seen.wire == "responses":
        output = [w.text_item(said.text)] if said.text else []
        output += [w.call_item(i, n, a) for i, n, a in said.calls]
        final = w.response(output)
        if stream:
            return _sse(w.sse(w.responses_events(final)))
        return _Reply(
            headers={"Content-Type": "application/json"}, body=final.model_dump_json().encode()
        )
    blocks = [w.text_block(said.text)] if said.text else []
    blocks += [w.tool_use_block(i, n, a) for i, n, a in said.calls]
    message_ = w.anthropic_message(blocks, stop_reason="tool_use" if said.calls else "end_turn")
    if stream:
        return _sse(w.sse(w.anthropic_events(message_)))
    return _Reply(
        headers={"Content-Type": "application/json"}, body=message_.model_dump_json().encode()
    )


def _refused(seen: Seen, status: int, message: str) -> _Reply:
    """The wire's own error answer (OpenAI's ``{"error": ...}``, Anthropic's typed one)."""
    error: Json = {"type": "invalid_request_error", "message": message}
    body: Json = {"type": "error", "error": error} if seen.wire == "anthropic" else {"error": error}
    headers = {"Content-Type": "application/json"}
    return _Reply(status=status, headers=headers, body=json.dumps(body).encode(), usage=None)


def _sse(text: str) -> _Reply:
    return _Reply(headers={"Content-Type": "text/event-stream"}, body=text.encode())

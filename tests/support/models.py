"""Scripted models shared by tests: small functions of the request, no network."""

from __future__ import annotations

from convoq import Message, ToolCall
from convoq.messages import MessageRole
from convoq.models import ModelRequest


def echo_history(request: ModelRequest) -> str:
    """Answers with the texts of every user message it was sent, in order."""
    users = [m.text for m in request.messages if m.role == MessageRole.USER]
    return " | ".join(users)


def call_tool_then_answer(name: str, arguments: dict[str, object]):  # type: ignore[no-untyped-def]
    """First asks for one tool call, then answers with the tool's result text."""

    def fn(request: ModelRequest) -> str | Message:
        last = request.messages[-1]
        if last.role == MessageRole.TOOL:
            return f"tool said: {last.text}"
        return Message(
            role=MessageRole.ASSISTANT,
            content=[],
            tool_calls=[
                ToolCall(id=f"call-{len(request.messages)}", name=name, arguments=arguments)
            ],
        )

    return fn

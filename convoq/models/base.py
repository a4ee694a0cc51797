"""What a model is to convoq: a request of messages and tools in, an assistant message out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from convoq.messages import Message

TextDeltaHandler = Callable[[str], Awaitable[None]]


class ToolSpec(BaseModel):
    """A tool as the model sees it: name, description and JSON schema of its arguments."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ModelRequest(BaseModel):
    """Exactly what is sent: instructions as a leading system message, the history window,
    the current turn so far; and the tools on offer."""

    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)


@runtime_checkable
class Model(Protocol):
    """A chat model. ``on_text_delta``, when given, receives text as it streams."""

    name: str

    async def request(
        self, request: ModelRequest, *, on_text_delta: TextDeltaHandler | None = None
    ) -> Message:
        """Return one assistant message (text and/or tool calls), or raise ModelError."""
        ...

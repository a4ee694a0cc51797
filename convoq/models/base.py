"""What a model is to convoq: a request of messages and tools in, an assistant message out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from convoq.messages import Message

# ModelSettings lives with its checks in convoq.model_settings (a layer below this one);
# named here too, where a model's request is, as it always was.
from convoq.model_settings import ModelSettings, ToolChoice

__all__ = [
    "Model",
    "ModelRequest",
    "ModelSettings",
    "OutputSpec",
    "TextDeltaHandler",
    "TextRetraction",
    "ToolChoice",
    "ToolSpec",
    "retraction_of",
]

TextDeltaHandler = Callable[[str], Awaitable[None]]
TextRetraction = Callable[[], Awaitable[None]]


def retraction_of(on_text_delta: TextDeltaHandler | None) -> TextRetraction | None:
    """The ``retract()`` a text handler offers, if any. A model that retries a call after
    some of its text went out (a stream dropped part way) calls it first: the text of that
    call so far is void, and it streams again from its start. To a handler without it, a
    model hands out no text twice: such a call ends with the error instead."""
    retract = getattr(on_text_delta, "retract", None)
    return retract if callable(retract) else None


class ToolSpec(BaseModel):
    """A tool as the model sees it: name, description and JSON schema of its arguments."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class OutputSpec(BaseModel):
    """The shape the final answer must have: a JSON schema with a name. A model that
    supports structured output is asked for it (``strict`` where the API has it); one that
    does not gets it in its instructions; the engine validates the answer either way."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    json_schema: dict[str, Any]
    strict: bool = True


class ModelRequest(BaseModel):
    """Exactly what is sent: instructions as a leading system message, the history window,
    the current turn so far; the tools on offer; the settings and the output shape asked
    for (``None``: the model's own defaults, free text)."""

    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)
    settings: ModelSettings | None = None
    output: OutputSpec | None = None


@runtime_checkable
class Model(Protocol):
    """A chat model. ``on_text_delta``, when given, receives text as it streams (and, if
    it has one, its ``retract()`` before a retry of a call whose text went out part way:
    :func:`retraction_of`).

    A model whose API takes ``request.output`` (a JSON schema to answer in) says so with
    an attribute ``structured_output = True``; for any other model the engine puts the
    schema in the instructions. Within a turn, a system message after the user message is
    the engine asking again for an answer that did not fit the output type.
    """

    name: str

    async def request(
        self, request: ModelRequest, *, on_text_delta: TextDeltaHandler | None = None
    ) -> Message:
        """Return one assistant message (text and/or tool calls), or raise ModelError."""
        ...

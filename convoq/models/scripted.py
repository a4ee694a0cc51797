"""An offline model whose answers a function gives: for tests, demos and benchmarks."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, TypeAdapter

from convoq._sync import call_maybe_async
from convoq.errors import ModelError
from convoq.messages import Message, MessageRole
from convoq.models.base import ModelRequest, TextDeltaHandler

ScriptFn = Callable[[ModelRequest], Any]


class ScriptedModel:
    """A model answered by ``fn(request)``: a ``str`` (final text), an assistant ``Message``,
    or a dict, list, pydantic model or dataclass (sent as its JSON text, as a model asked
    for structured output answers). ``fn`` sees the whole request: its ``settings`` and
    ``output`` (the shape asked for) too. ``structured_output=False`` plays a model that
    cannot be asked for a shape: the engine then puts the schema in its instructions.

    ``fn`` may be sync (it then runs in a worker thread) or async. Text answers are streamed
    word by word to ``on_text_delta`` so streaming paths are exercised offline too. An
    assistant Message may carry ``usage``, ``finish_reason`` or ``refusal`` to play a server
    that reports them (``Message.assistant("...", usage=Usage(...), finish_reason="length")``).
    """

    def __init__(
        self, fn: ScriptFn, *, name: str = "scripted", structured_output: bool = True
    ) -> None:
        self._fn = fn
        self.name = name
        self.structured_output = structured_output
        self.calls: list[ModelRequest] = []

    @classmethod
    def from_replies(
        cls, replies: Iterable[str | Message], *, name: str = "scripted"
    ) -> ScriptedModel:
        """Answer with ``replies`` in order; raise a clear ModelError when they run out."""
        pending = list(replies)

        def next_reply(_request: ModelRequest) -> str | Message:
            if not pending:
                raise ModelError("ScriptedModel ran out of scripted replies")
            return pending.pop(0)

        return cls(next_reply, name=name)

    async def request(
        self, request: ModelRequest, *, on_text_delta: TextDeltaHandler | None = None
    ) -> Message:
        self.calls.append(request)
        answer = await call_maybe_async(self._fn, request)
        message = _as_assistant(answer)
        if on_text_delta is not None and message.text:
            for index, word in enumerate(message.text.split(" ")):
                await on_text_delta(word if index == 0 else " " + word)
                await asyncio.sleep(0)
        return message


def _as_assistant(answer: Any) -> Message:
    if isinstance(answer, str):
        return Message.assistant(answer)
    if isinstance(answer, Message) and answer.role == MessageRole.ASSISTANT:
        return answer
    if (
        isinstance(answer, dict | list)
        or (isinstance(answer, BaseModel) and not isinstance(answer, Message))
        or (dataclasses.is_dataclass(answer) and not isinstance(answer, type))
    ):
        return Message.assistant(TypeAdapter(Any).dump_json(answer).decode())
    raise ModelError(
        "a ScriptedModel function must return a str, an assistant Message or JSON data"
        " (a dict, list, pydantic model or dataclass),"
        f" got {type(answer).__name__}"
    )

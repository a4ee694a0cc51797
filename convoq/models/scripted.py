"""An offline model whose answers a function gives: for tests, demos and benchmarks."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, TypeAdapter

from convoq._sync import call_maybe_async
from convoq.errors import ConfigurationError, ModelError
from convoq.messages import Message, MessageRole
from convoq.models.base import ModelRequest, TextDeltaHandler

ScriptFn = Callable[[ModelRequest], Any]

# Requests a ScriptedModel remembers by default: enough for a test to look at a turn's
# model calls, bounded so that a long-lived worker serving one does not grow per turn.
KEEP_CALLS = 16


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

    Attributes:
        calls: the last ``keep_calls`` requests it was given, oldest first (``keep_calls=0``
            remembers none).
        call_count: how many requests it was given in all.

    Raises:
        ConfigurationError: ``keep_calls`` is negative.
    """

    def __init__(
        self,
        fn: ScriptFn,
        *,
        name: str = "scripted",
        structured_output: bool = True,
        keep_calls: int = KEEP_CALLS,
    ) -> None:
        if keep_calls < 0:
            raise ConfigurationError(
                f"keep_calls must be >= 0 (the requests to remember), got {keep_calls}"
            )
        self._fn = fn
        self.name = name
        self.structured_output = structured_output
        self.calls: deque[ModelRequest] = deque(maxlen=keep_calls)
        self.call_count = 0

    @classmethod
    def from_replies(
        cls,
        replies: Iterable[str | Message],
        *,
        name: str = "scripted",
        keep_calls: int = KEEP_CALLS,
    ) -> ScriptedModel:
        """Answer with ``replies`` in order; raise a clear ModelError when they run out."""
        pending = list(replies)

        def next_reply(_request: ModelRequest) -> str | Message:
            if not pending:
                raise ModelError("ScriptedModel ran out of scripted replies")
            return pending.pop(0)

        return cls(next_reply, name=name, keep_calls=keep_calls)

    async def request(
        self, request: ModelRequest, *, on_text_delta: TextDeltaHandler | None = None
    ) -> Message:
        self.calls.append(request)  # the oldest drops out past keep_calls
        self.call_count += 1
        answer = await call_maybe_async(self._fn, request)
        message = _as_assistant(answer)
        if on_text_delta is not None and message.text:
            # Word by word, as fast as the handler takes them: a model answering at once
            # (a server's chunks all read already) hands over its deltas without a pause.
            for index, word in enumerate(message.text.split(" ")):
                await on_text_delta(word if index == 0 else " " + word)
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

"""Test helpers for memory authors and agent tests: memories that fail or are slow, a
model that records what it was sent, and a conformance suite
(:mod:`convoq.testing.conformance`) a custom memory can run against itself.

Nothing here touches the network; everything works with any :class:`ConversationMemory`
or any object with the memory guide's ``load``/``append``/``clear`` methods.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from convoq.memory.adapt import MemoryLike, as_memory
from convoq.memory.base import ConversationMemory
from convoq.memory.in_memory import InMemoryConversationMemory
from convoq.messages import Message
from convoq.models.base import ModelRequest, TextDeltaHandler

__all__ = ["FailingMemory", "MemoryFailure", "RecordingModel", "SlowMemory"]

_OPERATIONS = frozenset({"load", "append", "clear"})


class MemoryFailure(Exception):
    """What :class:`FailingMemory` raises: a store outage as a user's store raises it."""


class FailingMemory(ConversationMemory):
    """A memory whose chosen operations fail (the others go to ``inner``).

    Args:
        fail_on: the operations that raise :class:`MemoryFailure`: any of ``"load"``,
            ``"append"``, ``"clear"``.
        inner: where the other operations go (a fresh in-memory store by default).
    """

    def __init__(
        self,
        fail_on: str | set[str] | frozenset[str] = frozenset({"load", "append"}),
        inner: ConversationMemory | MemoryLike | None = None,
    ) -> None:
        chosen = {fail_on} if isinstance(fail_on, str) else set(fail_on)
        if not chosen <= _OPERATIONS:
            raise ValueError(f"fail_on takes {sorted(_OPERATIONS)}, not {sorted(chosen)}")
        self.fail_on = frozenset(chosen)
        self.inner = as_memory(inner if inner is not None else InMemoryConversationMemory())
        self.calls: list[tuple[str, str]] = []

    def _enter(self, operation: str, conversation_id: str) -> None:
        self.calls.append((operation, conversation_id))
        if operation in self.fail_on:
            raise MemoryFailure(f"{operation} failed for {conversation_id!r} (FailingMemory)")

    async def aload(self, conversation_id: str) -> list[Message]:
        self._enter("load", conversation_id)
        return await self.inner.aload(conversation_id)

    async def aappend(self, conversation_id: str, messages: list[Message]) -> None:
        self._enter("append", conversation_id)
        await self.inner.aappend(conversation_id, messages)

    async def aclear(self, conversation_id: str) -> None:
        self._enter("clear", conversation_id)
        await self.inner.aclear(conversation_id)


class SlowMemory(ConversationMemory):
    """A memory that waits ``delay_s`` (without blocking the event loop) before each
    operation of ``inner``: for cancellation, timeout and concurrency tests."""

    def __init__(
        self, delay_s: float = 0.05, inner: ConversationMemory | MemoryLike | None = None
    ) -> None:
        self.delay_s = delay_s
        self.inner = as_memory(inner if inner is not None else InMemoryConversationMemory())

    async def aload(self, conversation_id: str) -> list[Message]:
        await asyncio.sleep(self.delay_s)
        return await self.inner.aload(conversation_id)

    async def aappend(self, conversation_id: str, messages: list[Message]) -> None:
        await asyncio.sleep(self.delay_s)
        await self.inner.aappend(conversation_id, messages)

    async def aclear(self, conversation_id: str) -> None:
        await asyncio.sleep(self.delay_s)
        await self.inner.aclear(conversation_id)


class RecordingModel:
    """A model that records every request and answers ``reply(request)`` (by default the
    number of messages it was sent, ``"seen N"``).

    ``requests`` holds each request; ``sent`` the messages of each.
    """

    def __init__(
        self, reply: Callable[[ModelRequest], str | Message] | None = None, *, name: str = "rec"
    ) -> None:
        self.name = name
        self._reply = reply
        self.requests: list[ModelRequest] = []

    @property
    def sent(self) -> list[list[Message]]:
        return [request.messages for request in self.requests]

    async def request(
        self, request: ModelRequest, *, on_text_delta: TextDeltaHandler | None = None
    ) -> Message:
        self.requests.append(request.model_copy(deep=True))
        answer: Any = self._reply(request) if self._reply else f"seen {len(request.messages)}"
        message = Message.assistant(answer) if isinstance(answer, str) else answer
        if on_text_delta is not None and message.text:
            await on_text_delta(message.text)
        return message

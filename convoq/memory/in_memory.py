"""Conversation memory in process memory, for tests, scripts and short-lived agents."""

from __future__ import annotations

import threading

from convoq.memory.base import StoredConversationMemory
from convoq.messages import Message, messages_from_json, messages_to_json
from convoq.window import Window, split_turns


class InMemoryConversationMemory(StoredConversationMemory):
    """Keeps every conversation in a dict; safe to share between threads and tasks.

    Messages are stored as their JSON form, so callers can never change stored history by
    mutating a message they appended or loaded, and bytes round-trip exactly as they do
    through the persistent backends.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # One JSON array per append: appending never re-encodes earlier turns.
        self._chunks: dict[str, list[bytes]] = {}

    # Nothing here waits on I/O: sync calls run right on the caller's thread, async calls
    # run the same code without leaving their loop.
    async def _read(self, conversation_id: str, window: Window) -> list[Message]:
        return self._read_blocking(conversation_id, window)

    async def _write(self, conversation_id: str, messages: list[Message]) -> None:
        self._write_blocking(conversation_id, messages)

    async def _delete(self, conversation_id: str) -> None:
        self._delete_blocking(conversation_id)

    async def _prune(self, conversation_id: str, keep_last_turns: int) -> int:
        with self._lock:
            chunks = self._chunks.get(conversation_id, [])
            messages = [m for chunk in chunks for m in messages_from_json(chunk)]
            lead, turns = split_turns(messages)
            kept = turns[len(turns) - keep_last_turns :] if keep_last_turns else []
            if conversation_id in self._chunks:
                self._chunks[conversation_id] = [
                    messages_to_json(lead + [m for t in kept for m in t])
                ]
        return len(turns) - len(kept)

    def _read_blocking(self, conversation_id: str, window: Window) -> list[Message]:
        with self._lock:
            chunks = list(self._chunks.get(conversation_id, ()))
        messages: list[Message] = []
        for chunk in chunks:
            messages.extend(messages_from_json(chunk))
        return messages

    def _write_blocking(self, conversation_id: str, messages: list[Message]) -> None:
        # Encode outside the lock: a big attachment must not hold up other conversations.
        chunk = messages_to_json(messages)
        with self._lock:
            self._chunks.setdefault(conversation_id, []).append(chunk)

    def _delete_blocking(self, conversation_id: str) -> None:
        with self._lock:
            self._chunks.pop(conversation_id, None)

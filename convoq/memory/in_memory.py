"""Conversation memory in process memory, for tests, scripts and short-lived agents."""

from __future__ import annotations

import threading

from convoq.memory._popping import Keep, covers_newest_turn, kept_in_place
from convoq.memory.base import StoredConversationMemory, basis_of, summary_conflict
from convoq.messages import Message, messages_from_json, messages_to_json
from convoq.summary import Summary, SummaryBasis
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
        self._summaries: dict[str, Summary] = {}

    # Nothing here waits on I/O: sync calls run right on the caller's thread, async calls
    # run the same code without leaving their loop.
    async def _read(self, conversation_id: str, window: Window) -> list[Message]:
        return self._read_blocking(conversation_id, window)

    async def _write(self, conversation_id: str, messages: list[Message]) -> None:
        self._write_blocking(conversation_id, messages)

    async def _delete(self, conversation_id: str) -> None:
        self._delete_blocking(conversation_id)

    async def _summary_state(
        self, conversation_id: str
    ) -> tuple[list[Message], Summary | None, SummaryBasis]:
        with self._lock:
            messages = self._messages(conversation_id)
            summary = self._summaries.get(conversation_id)
        return messages, summary, basis_of(messages, summary)

    async def _commit_summary(
        self, conversation_id: str, summary: Summary, basis: SummaryBasis
    ) -> None:
        with self._lock:  # the check and the write under one lock: a fenced write
            current = self._summaries.get(conversation_id)
            if basis_of(self._messages(conversation_id), current) != basis:
                raise summary_conflict(conversation_id)
            self._summaries[conversation_id] = summary

    def _messages(self, conversation_id: str) -> list[Message]:
        chunks = self._chunks.get(conversation_id, ())
        return [m for chunk in chunks for m in messages_from_json(chunk)]

    async def _pop_held(self, conversation_id: str, keep: Keep | None) -> Message | None:
        """Under the lock: only the chunk (one append's messages) holding the newest
        message is decoded and written again."""
        with self._lock:
            chunks = self._chunks.get(conversation_id, [])
            at, messages = len(chunks) - 1, []
            while at >= 0 and not (messages := messages_from_json(chunks[at])):
                at -= 1  # a prune may leave a chunk of no message
            if at < 0:
                return None
            newest = messages[-1]
            rest = messages[:-1] + kept_in_place(keep, newest)
            summary = self._summaries.get(conversation_id)
            if covers_newest_turn(self._messages(conversation_id) if summary else [], summary):
                del self._summaries[conversation_id]
            if rest:
                chunks[at] = messages_to_json(rest)
            else:
                del chunks[at]
            return newest

    async def _prune(self, conversation_id: str, keep_last_turns: int) -> int:
        with self._lock:
            chunks = self._chunks.get(conversation_id, [])
            messages = [m for chunk in chunks for m in messages_from_json(chunk)]
            lead, turns = split_turns(messages)
            kept = turns[len(turns) - keep_last_turns :] if keep_last_turns else []
            if conversation_id in self._chunks:
                kept_messages = lead + [m for turn in kept for m in turn]
                self._chunks[conversation_id] = [messages_to_json(kept_messages)]
            dropped = len(turns) - len(kept)
            summary = self._summaries.get(conversation_id)
            if summary is not None:  # the summary stays; it now covers fewer stored turns
                watermark = max(0, summary.watermark - dropped)
                self._summaries[conversation_id] = summary.model_copy(
                    update={"watermark": watermark}
                )
        return dropped

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
            self._summaries.pop(conversation_id, None)

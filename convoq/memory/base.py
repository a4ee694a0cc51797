"""The memory protocol for users and the base class that holds the shared logic.

``ConversationMemory`` is what the Agent talks to. A subclass that writes only the sync
or only the async flavour of a method gets the other for free. convoq's own backends
derive from :class:`StoredConversationMemory`, which validates ids and messages, applies
the window and tracks reservations once; backends only store.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from convoq._sync import run_blocking, run_sync
from convoq.errors import ConversationBusyError, ConvoqError, InvalidMessageError
from convoq.ids import check_conversation_id
from convoq.messages import Message
from convoq.tokens import TokenCounter
from convoq.window import Window, check_budget

_RESERVATION_LOCK = threading.Lock()


@dataclass
class _Reservations:
    holders: dict[str, str] = field(default_factory=dict)
    spent: set[str] = field(default_factory=set)


class ConversationMemory:
    """Stores each conversation's messages. Override ``load``/``append``/``clear`` or
    their async twins ``aload``/``aappend``/``aclear``; the other flavour follows.

    The three methods take exactly what the memory guide's interface takes (a conversation
    id, and the messages of one turn for ``append``); what is *sent* of the history is
    chosen by :meth:`aload_window`, which trims what ``aload`` returns unless a backend
    windows at its source.
    """

    def load(self, conversation_id: str) -> list[Message]:
        """Every stored message of a conversation (an empty list for an unknown one)."""
        self._require_override("load", "aload")
        return run_sync(self.aload(conversation_id))

    async def aload(self, conversation_id: str) -> list[Message]:
        self._require_override("aload", "load")
        return await run_blocking(self.load, conversation_id)

    def append(self, conversation_id: str, messages: list[Message]) -> None:
        """Append messages (a whole turn) to a conversation."""
        self._require_override("append", "aappend")
        run_sync(self.aappend(conversation_id, messages))

    async def aappend(self, conversation_id: str, messages: list[Message]) -> None:
        self._require_override("aappend", "append")
        await run_blocking(self.append, conversation_id, messages)

    def clear(self, conversation_id: str) -> None:
        """Delete every message of a conversation."""
        self._require_override("clear", "aclear")
        run_sync(self.aclear(conversation_id))

    async def aclear(self, conversation_id: str) -> None:
        self._require_override("aclear", "clear")
        await run_blocking(self.clear, conversation_id)

    async def aload_window(self, conversation_id: str, window: Window) -> list[Message]:
        """The messages of ``window`` (what a turn sends): by default everything ``aload``
        returns, trimmed here; convoq's backends read only the window where they can."""
        return window.apply(await self.aload(conversation_id))

    # Reservations: at most one turn per conversation runs through one memory at a time.
    # A token is spent once its turn finished or was discarded, so a continuation cannot
    # be resumed twice.
    def reserve(self, conversation_id: str, token: str) -> None:
        """Mark a conversation busy for ``token``; raise if another token holds it.

        Raises:
            ConversationBusyError: another turn runs or awaits approval.
            ConvoqError: ``token`` belongs to a turn that already finished or was discarded.
        """
        with self._reservation_lock:
            state = self._reservation_state
            if token in state.spent:
                raise ConvoqError(
                    "this continuation was already resumed or discarded; start a new turn",
                    conversation_id=conversation_id,
                )
            holder = state.holders.get(conversation_id)
            if holder is not None and holder != token:
                raise ConversationBusyError(
                    f"conversation {conversation_id!r} has a turn running or awaiting approval;"
                    " wait for it, resume it or discard its continuation",
                    conversation_id=conversation_id,
                )
            state.holders[conversation_id] = token

    def release(self, conversation_id: str, token: str, *, spent: bool = False) -> None:
        """Free a conversation reserved with ``token`` (a no-op for another token)."""
        with self._reservation_lock:
            state = self._reservation_state
            if state.holders.get(conversation_id) == token:
                del state.holders[conversation_id]
            if spent:
                state.spent.add(token)

    @property
    def _reservation_lock(self) -> threading.Lock:
        return _RESERVATION_LOCK

    @property
    def _reservation_state(self) -> _Reservations:
        # Set lazily so user subclasses need not call super().__init__().
        found: _Reservations | None = self.__dict__.get("_convoq_reservations")
        if found is None:
            found = self.__dict__.setdefault("_convoq_reservations", _Reservations())
        return found

    def _require_override(self, name: str, twin: str) -> None:
        cls = type(self)
        if getattr(cls, twin) is getattr(ConversationMemory, twin):
            raise NotImplementedError(f"{cls.__name__} must implement {name} or {twin}")


class StoredConversationMemory(ConversationMemory, ABC):
    """Template for convoq's backends: checks once here, storage in ``_read``/``_write``/
    ``_delete``. Their sync twins (``_read_blocking``...) run the async ones on the bridge
    loop unless a backend can do its I/O on the caller's thread, which skips the hop."""

    async def aload(
        self,
        conversation_id: str,
        *,
        last_turns: int | None = None,
        max_tokens: int | None = None,
        counter: TokenCounter | None = None,
    ) -> list[Message]:
        """Messages of a conversation; with ``last_turns`` and/or ``max_tokens``, the
        leading system/developer messages plus only the newest whole turns of that
        window (see :class:`convoq.window.Window`)."""
        return await self.aload_window(conversation_id, _window(last_turns, max_tokens, counter))

    def load(
        self,
        conversation_id: str,
        *,
        last_turns: int | None = None,
        max_tokens: int | None = None,
        counter: TokenCounter | None = None,
    ) -> list[Message]:
        """Blocking :meth:`aload`."""
        window = _window(last_turns, max_tokens, counter)
        check_conversation_id(conversation_id)
        return window.apply(self._read_blocking(conversation_id, window))

    async def aload_window(self, conversation_id: str, window: Window) -> list[Message]:
        check_conversation_id(conversation_id)
        # Backends may window at the source; this guarantees the contract for all of them.
        return window.apply(await self._read(conversation_id, window))

    async def aappend(self, conversation_id: str, messages: list[Message]) -> None:
        if _check_append(conversation_id, messages):
            await self._write(conversation_id, messages)

    def append(self, conversation_id: str, messages: list[Message]) -> None:
        if _check_append(conversation_id, messages):
            self._write_blocking(conversation_id, messages)

    async def aclear(self, conversation_id: str) -> None:
        check_conversation_id(conversation_id)
        await self._delete(conversation_id)

    def clear(self, conversation_id: str) -> None:
        check_conversation_id(conversation_id)
        self._delete_blocking(conversation_id)

    @abstractmethod
    async def _read(self, conversation_id: str, window: Window) -> list[Message]:
        """All messages, or (optionally) only those of ``window`` (or a superset)."""

    @abstractmethod
    async def _write(self, conversation_id: str, messages: list[Message]) -> None:
        """Append messages atomically: all of them or none."""

    @abstractmethod
    async def _delete(self, conversation_id: str) -> None:
        """Remove the conversation; a missing one is not an error."""

    def _read_blocking(self, conversation_id: str, window: Window) -> list[Message]:
        return run_sync(self._read(conversation_id, window))

    def _write_blocking(self, conversation_id: str, messages: list[Message]) -> None:
        run_sync(self._write(conversation_id, messages))

    def _delete_blocking(self, conversation_id: str) -> None:
        run_sync(self._delete(conversation_id))


def _window(last_turns: int | None, max_tokens: int | None, counter: TokenCounter | None) -> Window:
    if last_turns is not None and last_turns < 0:
        raise ConvoqError("last_turns must be >= 0 (None or 0 loads every turn)")
    return Window(last_turns or None, check_budget(max_tokens, "max_tokens"), counter)


def _check_append(conversation_id: str, messages: list[Message]) -> bool:
    """Whether there is anything to write; raises before any I/O on bad input."""
    check_conversation_id(conversation_id)
    if not isinstance(messages, list) or not all(isinstance(m, Message) for m in messages):
        raise InvalidMessageError("append takes a list of Message", rule="type")
    return bool(messages)

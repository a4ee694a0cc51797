"""The memory protocol for users and the base class that holds the shared logic.

``ConversationMemory`` is what the Agent talks to. A subclass that writes only the sync
or only the async flavour of a method gets the other for free. convoq's own backends
derive from :class:`StoredConversationMemory`, which validates ids and messages, applies
the window and tracks reservations once; backends only store (and keep spent
continuation tokens, so a continuation runs once whichever object resumes it).
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod

from convoq._sync import run_blocking, run_sync
from convoq.errors import (
    ConversationBusyError,
    ConvoqError,
    InvalidMessageError,
    SummaryConflictError,
)
from convoq.ids import check_conversation_id
from convoq.memory._popping import Keep, check_pop, rewrite_without_newest
from convoq.memory._turns import TurnHooks
from convoq.messages import Message, messages_to_json
from convoq.summary import Summary, SummaryBasis, fingerprint, with_summary
from convoq.tokens import TokenCounter
from convoq.window import Window, check_budget, split_turns


class ConversationMemory(TurnHooks):
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

    async def apop_message(
        self, conversation_id: str, *, wait_s: float = 0.0, keep: Keep | None = None
    ) -> Message | None:
        """Remove the newest stored message and return it (None: nothing is stored), a
        writer like any turn: it waits up to ``wait_s`` seconds while a turn of the
        conversation holds it (runs, awaits approval, or on Redis is queued).

        Args:
            wait_s: how long to wait for a busy conversation (0: refuse at once).
            keep: given the newest message, the messages stored in its place (say, that
                message less its last tool call); None: nothing stays. A whole turn goes
                when its only message goes.

        convoq's backends do it in one atomic step, whatever else writes meanwhile: in
        memory and in files under their lock, on Redis in one script reading and writing
        only the last stored element. This default serves a memory that implements only
        ``load``/``append``/``clear``: it rewrites the conversation (load, clear, append
        back) holding its reservation, which keeps out writers through this memory object
        but not another process writing the same store.

        Raises:
            ConversationBusyError: a turn still held the conversation after ``wait_s``;
                nothing changed.
        """
        check_pop(conversation_id, wait_s, keep)
        token = secrets.token_hex(16)
        await self.areserve(conversation_id, token, wait_s=wait_s)
        try:
            return await self._pop_held(conversation_id, keep)
        finally:
            await self.arelease(conversation_id, token)

    def pop_message(
        self, conversation_id: str, *, wait_s: float = 0.0, keep: Keep | None = None
    ) -> Message | None:
        """Blocking :meth:`apop_message`."""
        return run_sync(self.apop_message(conversation_id, wait_s=wait_s, keep=keep))

    async def _pop_held(self, conversation_id: str, keep: Keep | None) -> Message | None:
        """The pop while the caller holds the conversation's reservation: a rewrite here;
        convoq's backends replace it with one step under their lock."""
        return await rewrite_without_newest(self, conversation_id, keep)

    def _require_override(self, name: str, twin: str) -> None:
        cls = type(self)
        if getattr(cls, twin) is getattr(ConversationMemory, twin):
            raise NotImplementedError(f"{cls.__name__} must implement {name} or {twin}")


class StoredConversationMemory(ConversationMemory, ABC):
    """Template for convoq's backends: checks once here, storage in ``_read``/``_write``/
    ``_delete``. Their sync twins (``_read_blocking``...) run the async ones on the bridge
    loop unless a backend can do its I/O on the caller's thread, which skips the hop."""

    # True in a backend whose async ``_read`` answers a new list of exactly the window's
    # messages (the window is then not applied again here).
    _reads_exact_windows = False

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

    async def aload_json(self, conversation_id: str, *, last_turns: int | None = None) -> bytes:
        """The messages :meth:`aload` returns (the lead and, with ``last_turns``, only the
        newest whole turns), as one JSON array in convoq's JSON form (attachments as
        base64, :func:`~convoq.messages.messages_to_json`): for a reader that only
        forwards them. A Redis memory passes the stored JSON through, decoding no message
        it does not have to (:mod:`convoq.redis._raw`); this default encodes a load."""
        return messages_to_json(await self.aload(conversation_id, last_turns=last_turns))

    def load_json(self, conversation_id: str, *, last_turns: int | None = None) -> bytes:
        """Blocking :meth:`aload_json`."""
        return messages_to_json(self.load(conversation_id, last_turns=last_turns))

    async def aload_window(self, conversation_id: str, window: Window) -> list[Message]:
        check_conversation_id(conversation_id)
        # Backends may window at the source; this guarantees the contract for all of them
        # (but those that read exactly the window: see _reads_exact_windows).
        if window.with_summary:
            return window.apply(await self._read_sent(conversation_id, window))
        read = await self._read(conversation_id, window)
        return read if self._reads_exact_windows else window.apply(read)

    # -- the rolling summary (see convoq.summary and convoq.compaction) ------------------
    async def asummary(self, conversation_id: str) -> Summary | None:
        """The conversation's stored summary, if any."""
        check_conversation_id(conversation_id)
        return (await self._summary_state(conversation_id))[1]

    def summary(self, conversation_id: str) -> Summary | None:
        """Blocking :meth:`asummary`."""
        return run_sync(self.asummary(conversation_id))

    async def asummary_state(
        self, conversation_id: str
    ) -> tuple[list[Message], Summary | None, SummaryBasis]:
        """The whole history, its summary and the basis a new summary is committed on."""
        check_conversation_id(conversation_id)
        return await self._summary_state(conversation_id)

    async def acommit_summary(
        self, conversation_id: str, summary: Summary, basis: SummaryBasis
    ) -> None:
        """Store ``summary`` if the history and the previous summary are still ``basis``.

        Raises:
            SummaryConflictError: they changed; nothing was written.
        """
        check_conversation_id(conversation_id)
        await self._commit_summary(conversation_id, summary, basis)

    async def aunsummarised_turns(self, conversation_id: str) -> int:
        """How many stored turns come after the summary (all of them without one): what a
        turn-count compaction threshold looks at, cheaply where the backend can."""
        check_conversation_id(conversation_id)
        messages, summary, _ = await self._summary_state(conversation_id)
        return len(split_turns(messages)[1]) - (summary.watermark if summary else 0)

    async def _read_sent(self, conversation_id: str, window: Window) -> list[Message]:
        messages, summary, _ = await self._summary_state(conversation_id)
        lead, turns = split_turns(messages)
        return with_summary(lead, turns, summary)

    async def _summary_state(
        self, conversation_id: str
    ) -> tuple[list[Message], Summary | None, SummaryBasis]:
        raise NotImplementedError(f"{type(self).__name__} stores no summaries")

    async def _commit_summary(
        self, conversation_id: str, summary: Summary, basis: SummaryBasis
    ) -> None:
        raise NotImplementedError(f"{type(self).__name__} stores no summaries")

    async def aappend(self, conversation_id: str, messages: list[Message]) -> None:
        if _check_append(conversation_id, messages):
            await self._write(conversation_id, messages)

    def append(self, conversation_id: str, messages: list[Message]) -> None:
        if _check_append(conversation_id, messages):
            self._write_blocking(conversation_id, messages)

    async def aclear(self, conversation_id: str) -> None:
        check_conversation_id(conversation_id)
        await self._delete(conversation_id)
        await self._drop_parked(conversation_id)

    def clear(self, conversation_id: str) -> None:
        check_conversation_id(conversation_id)
        self._delete_blocking(conversation_id)
        # A turn awaiting approval is dropped with the history it would have continued.
        if self._reservations.holders().get(conversation_id) is not None:
            run_sync(self._drop_parked(conversation_id))

    async def aprune(self, conversation_id: str, *, keep_last_turns: int) -> int:
        """Drop all but the newest ``keep_last_turns`` whole turns (and attachments only
        they used); leading messages and a stored summary stay. Returns the turns dropped.

        Raises:
            ConversationBusyError: a turn of the conversation is in progress.
        """
        check_conversation_id(conversation_id)
        if isinstance(keep_last_turns, bool) or not isinstance(keep_last_turns, int):
            raise ConvoqError("keep_last_turns must be an int >= 0")
        if keep_last_turns < 0:
            raise ConvoqError("keep_last_turns must be >= 0 (0 drops every turn)")
        self._check_idle(conversation_id)
        return await self._prune(conversation_id, keep_last_turns)

    def prune(self, conversation_id: str, *, keep_last_turns: int) -> int:
        """Blocking :meth:`aprune`."""
        return run_sync(self.aprune(conversation_id, keep_last_turns=keep_last_turns))

    async def adelete(self, conversation_id: str) -> None:
        """Erase everything of a conversation (history, attachments, summary, and on Redis
        its turn records, events and idempotency keys), even while a turn is queued: for
        data-protection requests."""
        check_conversation_id(conversation_id)
        await self._erase(conversation_id)

    def delete(self, conversation_id: str) -> None:
        """Blocking :meth:`adelete`."""
        run_sync(self.adelete(conversation_id))

    def _check_idle(self, conversation_id: str) -> None:
        if conversation_id in self._reservations.holders():
            raise ConversationBusyError(
                f"conversation {conversation_id!r} has a turn running or awaiting approval;"
                " prune it once that turn is finished",
                conversation_id=conversation_id,
            )

    async def _prune(self, conversation_id: str, keep_last_turns: int) -> int:
        """Keep the newest turns: a read-modify-write under the backend's lock."""
        raise NotImplementedError(f"{type(self).__name__} cannot prune")

    async def _erase(self, conversation_id: str) -> None:
        await self._delete(conversation_id)

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


def basis_of(messages: list[Message], summary: Summary | None) -> SummaryBasis:
    """The basis of a history held in process (in-memory and file backends)."""
    turns = split_turns(messages)[1]
    last = fingerprint(turns[-1]) if turns else ""
    return SummaryBasis(turns=len(turns), last=last, version=summary.version if summary else 0)


def summary_conflict(conversation_id: str) -> SummaryConflictError:
    return SummaryConflictError(
        f"the history or the summary of conversation {conversation_id!r} changed while it"
        " was being summarised; nothing was stored (compaction runs again later)",
        conversation_id=conversation_id,
    )


def _check_append(conversation_id: str, messages: list[Message]) -> bool:
    """Whether there is anything to write; raises before any I/O on bad input."""
    check_conversation_id(conversation_id)
    if not isinstance(messages, list) or not all(isinstance(m, Message) for m in messages):
        raise InvalidMessageError("append takes a list of Message", rule="type")
    return bool(messages)

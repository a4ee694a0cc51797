"""The hooks through which a turn holds its conversation: reserve, park, commit, release.

The Agent (and inline compaction) call them on any :class:`ConversationMemory`. These
defaults keep reservations in the memory object (one process) and spent continuation
tokens in it until they expire; convoq's stored backends keep spent tokens in the store,
and the Redis backend replaces the reservation with the conversation's lease and a
fenced commit, so there one writer spans every process and worker.
"""

from __future__ import annotations

import asyncio
import threading
import time

from convoq._sync import run_sync
from convoq.errors import ConversationBusyError, ConvoqError
from convoq.memory._reservations import Reservations, SpentTokens, now_ms
from convoq.messages import Message

_LAZY_LOCK = threading.Lock()
# How often a turn told to wait looks again at a busy conversation.
_BUSY_POLL_S = 0.05


class TurnHooks:
    """The turn hooks of :class:`~convoq.memory.base.ConversationMemory` (a base class)."""

    async def aappend(self, conversation_id: str, messages: list[Message]) -> None:
        raise NotImplementedError  # ConversationMemory provides it

    async def areserve(
        self,
        conversation_id: str,
        token: str,
        *,
        resume_until_ms: int | None = None,
        wait_s: float = 0.0,
    ) -> None:
        """Reserve a conversation for the turn ``token`` before it loads history.

        Args:
            resume_until_ms: the token is a continuation's, resumed now and valid until
                then (unix ms): it is spent here, in the store, so it runs once.
            wait_s: how long to wait for a busy conversation (0: refuse at once).

        Raises:
            ConversationBusyError: another turn runs or awaits approval.
            ConvoqError: the continuation was already resumed or discarded.
        """
        deadline = time.monotonic() + wait_s
        while (holder := self._reservations.take(conversation_id, token)) is not None:
            parked = holder.removeprefix("parked:")
            if parked != holder and await self._is_spent(conversation_id, parked):
                # Its continuation was resumed or discarded through another object.
                self._reservations.free_parked(conversation_id, parked)
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConversationBusyError(
                    f"conversation {conversation_id!r} has a turn running or awaiting approval;"
                    " wait for it, resume it or discard its continuation",
                    conversation_id=conversation_id,
                )
            await asyncio.sleep(min(_BUSY_POLL_S, left))
        if resume_until_ms is None:
            return
        try:
            fresh = await self._spend(conversation_id, token, resume_until_ms)
        except BaseException:
            self._reservations.free(conversation_id, token)
            raise
        if not fresh:
            self._reservations.free(conversation_id, token)
            raise ConvoqError(
                "this continuation was already resumed or discarded; start a new turn",
                conversation_id=conversation_id,
            )

    def reserve(self, conversation_id: str, token: str) -> None:
        """Blocking :meth:`areserve` (no waiting)."""
        run_sync(self.areserve(conversation_id, token))

    def release(self, conversation_id: str, token: str) -> None:
        """Blocking :meth:`arelease`."""
        run_sync(self.arelease(conversation_id, token))

    async def apark(self, conversation_id: str, token: str, *, ttl_s: float) -> None:
        """The turn ``token`` awaits approval: keep its reservation ``ttl_s`` at most."""
        self._reservations.park(conversation_id, token, ttl_s)

    async def acommit_turn(self, conversation_id: str, token: str, messages: list[Message]) -> None:
        """Store the finished turn ``token`` (as its reservation's holder) and free the
        conversation."""
        try:
            await self.aappend(conversation_id, messages)
        finally:
            self._reservations.free(conversation_id, token)

    async def arelease(
        self, conversation_id: str, token: str, *, spent_until_ms: int | None = None
    ) -> None:
        """Free a conversation reserved by ``token`` (a no-op for another token).
        ``spent_until_ms``: the continuation was discarded; spend its token."""
        self._reservations.free(conversation_id, token)
        if spent_until_ms is not None:
            await self._spend(conversation_id, token, spent_until_ms)

    async def _spend(self, conversation_id: str, token: str, until_ms: int) -> bool:
        """Record a continuation token as used; False if it already was. Here it is kept
        by this object until the continuation expires; convoq's backends keep it in the
        store, where every object and process on that store sees it."""
        return self._spent_tokens.spend(token, until_ms)

    async def _drop_parked(self, conversation_id: str) -> None:
        """After a clear: free a turn awaiting approval here and spend its token, so its
        continuation cannot go on with the history it was paused in gone."""
        freed = self._reservations.free_parked(conversation_id)
        if freed is not None:
            token, left_s = freed
            await self._spend(conversation_id, token, now_ms() + int(left_s * 1000) + 1)

    async def _is_spent(self, conversation_id: str, token: str) -> bool:
        """Whether a continuation token was spent (read only)."""
        return token in self._spent_tokens

    @property
    def _reservations(self) -> Reservations:
        # Set lazily so user subclasses need not call super().__init__().
        found: Reservations | None = self.__dict__.get("_convoq_reservations")
        if found is None:
            with _LAZY_LOCK:
                found = self.__dict__.setdefault("_convoq_reservations", Reservations())
        return found

    @property
    def _spent_tokens(self) -> SpentTokens:
        found: SpentTokens | None = self.__dict__.get("_convoq_spent")
        if found is None:
            with _LAZY_LOCK:
                found = self.__dict__.setdefault("_convoq_spent", SpentTokens())
        return found

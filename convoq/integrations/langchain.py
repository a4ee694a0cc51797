"""convoq memory as a LangChain chat message history (``pip install 'convoq[langchain]'``).

:class:`ConvoqChatMessageHistory` is a ``BaseChatMessageHistory`` over any convoq memory,
for ``RunnableWithMessageHistory`` and everything else that takes one. Each LangChain
message is stored as one convoq message (see :mod:`convoq.integrations._langchain_messages`)
and read back equal to what was added: text, images, tool calls and tool messages, with
their ids and metadata. With ``last_n_messages`` a read loads only the newest turns that
hold those messages, never the whole conversation.
"""

from __future__ import annotations

from collections.abc import Sequence

from convoq.integrations import missing_extra

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import BaseMessage
except ImportError as exc:  # the extra is not installed
    raise missing_extra(
        "langchain_core", extra="langchain", integration="convoq.integrations.langchain"
    ) from exc

from convoq._sync import run_sync
from convoq.errors import ConvoqError
from convoq.ids import check_conversation_id
from convoq.integrations._langchain_messages import from_convoq, to_convoq
from convoq.integrations._writes import append_as_a_turn
from convoq.memory import ConversationMemory, MemoryLike, as_memory
from convoq.window import Window

__all__ = ["ConvoqChatMessageHistory"]


class ConvoqChatMessageHistory(BaseChatMessageHistory):
    """LangChain's chat message history over a convoq memory, sync and async.

    Args:
        conversation_id: the convoq conversation (1-256 characters, no control characters).
        memory: any convoq memory (None: a :class:`~convoq.memory.RedisConversationMemory`
            resolved from the ``CONVOQ_*`` settings).
        last_n_messages: read only the newest this many messages (None: all of them). The
            store reads the newest that many turns (each holds at least one message), so
            the cost follows N, not the length of the conversation.
        busy_timeout_s: how long a write waits while a convoq turn of the conversation
            runs before ConversationBusyError.

    Writes append under the conversation's reservation (on Redis the lease that workers
    and in-process Agents take): one writer per conversation across processes.
    """

    def __init__(
        self,
        conversation_id: str,
        memory: ConversationMemory | MemoryLike | None = None,
        *,
        last_n_messages: int | None = None,
        busy_timeout_s: float = 30.0,
    ) -> None:
        if last_n_messages is not None and (
            isinstance(last_n_messages, bool)
            or not isinstance(last_n_messages, int)
            or last_n_messages < 1
        ):
            raise ConvoqError("last_n_messages must be an int >= 1 or None (None: every message)")
        if not busy_timeout_s >= 0:
            raise ConvoqError("busy_timeout_s must be a number of seconds >= 0")
        super().__init__()
        self.conversation_id = check_conversation_id(conversation_id)
        if memory is None:
            from convoq.memory.redis import RedisConversationMemory

            memory = RedisConversationMemory()
        self.memory = as_memory(memory)
        self.last_n_messages = last_n_messages
        self.busy_timeout_s = busy_timeout_s

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The stored messages (the newest ``last_n_messages`` of them), oldest first."""
        return run_sync(self.aget_messages())

    async def aget_messages(self) -> list[BaseMessage]:
        limit = self.last_n_messages
        if limit is None:
            stored = await self.memory.aload(self.conversation_id)
        else:
            window = Window(keep_last_turns=limit)
            stored = (await self.memory.aload_window(self.conversation_id, window))[-limit:]
        return [from_convoq(message) for message in stored]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        run_sync(self.aadd_messages(messages))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append ``messages`` in one write (all or none); bad input raises before I/O."""
        if isinstance(messages, BaseMessage | str | bytes) or not isinstance(messages, Sequence):
            raise ConvoqError("add_messages takes a sequence of LangChain messages")
        stored = [to_convoq(message) for message in messages]
        if stored:
            await append_as_a_turn(self.memory, self.conversation_id, stored, self.busy_timeout_s)

    def clear(self) -> None:
        run_sync(self.aclear())

    async def aclear(self) -> None:
        """Delete every message (ConversationBusyError on Redis while a turn is queued)."""
        await self.memory.aclear(self.conversation_id)

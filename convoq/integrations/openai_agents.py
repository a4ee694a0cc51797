"""convoq memory as the OpenAI Agents SDK's session (``pip install 'convoq[openai-agents]'``).

``Runner.run(agent, input, session=ConvoqSession("chat-1", memory))`` keeps the run's
items in any convoq memory: in process, in files, or in Redis, where every process and
worker sees the same conversation. Each item is stored as one convoq message (see
:mod:`convoq.integrations._responses_items`): items come back exactly as they were added,
images and files given as ``data:`` URLs are stored as attachments (once per conversation
on Redis), and convoq's windows, exports and retention work on the conversation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from convoq.integrations import missing_extra

try:
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings
    from agents.memory.session_settings import resolve_session_limit
except ImportError as exc:  # the extra is not installed
    raise missing_extra(
        "agents", extra="openai-agents", integration="convoq.integrations.openai_agents"
    ) from exc

from convoq.errors import ConvoqError
from convoq.ids import check_conversation_id
from convoq.integrations._responses_items import item_to_message, message_to_items
from convoq.integrations._writes import append_as_a_turn
from convoq.memory import ConversationMemory, MemoryLike, as_memory
from convoq.messages import Message
from convoq.window import Window

__all__ = ["ConvoqSession"]


class ConvoqSession:
    """The OpenAI Agents SDK's ``Session`` protocol over a convoq memory.

    Args:
        session_id: the convoq conversation id (1-256 characters, no control characters).
        memory: any convoq memory (None: a :class:`~convoq.memory.RedisConversationMemory`
            resolved from the ``CONVOQ_*`` settings).
        session_settings: the SDK's settings; ``limit`` bounds what ``get_items`` reads.
        busy_timeout_s: how long ``add_items`` and ``pop_item`` wait while a convoq turn
            of the conversation runs (a worker's, an Agent's, another session's write)
            before ConversationBusyError.

    ``add_items`` appends under the conversation's reservation, which on Redis is the
    lease workers and in-process Agents take: one writer per conversation across
    processes. ``get_items(limit)`` reads only the newest ``limit`` turns from the store,
    never the whole conversation.
    """

    def __init__(
        self,
        session_id: str,
        memory: ConversationMemory | MemoryLike | None = None,
        *,
        session_settings: SessionSettings | None = None,
        busy_timeout_s: float = 30.0,
    ) -> None:
        if not busy_timeout_s >= 0:
            raise ConvoqError("busy_timeout_s must be a number of seconds >= 0")
        self.session_id = check_conversation_id(session_id)
        if memory is None:
            from convoq.memory.redis import RedisConversationMemory

            memory = RedisConversationMemory()
        self.memory = as_memory(memory)
        self.session_settings = session_settings
        self.busy_timeout_s = busy_timeout_s

    @property
    def conversation_id(self) -> str:
        """The convoq conversation this session stores its items in."""
        return self.session_id

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The newest ``limit`` items (None: ``session_settings.limit``, else all), oldest
        first."""
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise ConvoqError(f"limit must be an int or None, not {limit!r}")
        if limit is not None and limit <= 0:
            return []
        if limit is None:
            messages = await self.memory.aload(self.session_id)
        else:
            # Every turn holds at least one message, so the newest `limit` turns hold the
            # newest `limit` items: a window read, not the whole conversation.
            window = Window(keep_last_turns=limit)
            messages = await self.memory.aload_window(self.session_id, window)
        items = [item for message in messages for item in message_to_items(message)]
        return cast(list[TResponseInputItem], items[-limit:] if limit else items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` in one write (all or none); bad items raise before any I/O."""
        if not isinstance(items, list | tuple):
            raise ConvoqError(f"add_items takes a list of items, not {type(items).__name__}")
        messages = [item_to_message(item) for item in items]
        if messages:
            await self._write(messages)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item (None for an empty session).

        One atomic step of the memory (:meth:`~convoq.memory.ConversationMemory.apop_message`):
        the newest stored message goes or, when convoq wrote it as several items (text and
        tool calls), loses only its last tool call; items another writer adds meanwhile
        stay, in order. While a convoq turn of the conversation runs (or on Redis is
        queued) it waits up to ``busy_timeout_s``, then raises ConversationBusyError.
        """

        def without_last_item(message: Message) -> list[Message]:
            items = message_to_items(message)
            if len(items) < 2:
                return []
            # Only a message convoq wrote reads as several items: its text, then a
            # function_call per tool call; so the last item is its last tool call.
            shorter = message.model_copy(update={"tool_calls": message.tool_calls[:-1]})
            if message_to_items(shorter) == items[:-1]:
                return [shorter]
            return [item_to_message(item) for item in items[:-1]]

        popped = await self.memory.apop_message(
            self.session_id, wait_s=self.busy_timeout_s, keep=without_last_item
        )
        if popped is None:
            return None
        return cast(TResponseInputItem, message_to_items(popped)[-1])

    async def clear_session(self) -> None:
        """Delete every item (ConversationBusyError on Redis while a turn is queued)."""
        await self.memory.aclear(self.session_id)

    async def _write(self, messages: list[Message]) -> None:
        await append_as_a_turn(self.memory, self.session_id, messages, self.busy_timeout_s)


if TYPE_CHECKING:  # mypy checks that ConvoqSession satisfies the SDK's Session protocol.
    from agents.memory import Session

    def _conforms(session: ConvoqSession) -> Session:
        return session

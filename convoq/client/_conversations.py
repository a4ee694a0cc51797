"""A conversation from the client: its stored history, the usage its turns reported, and
clearing it. Each checks the conversation id before its one call to the store."""

from __future__ import annotations

from convoq.ids import check_conversation_id
from convoq.messages import Message
from convoq.redis.roles import ClientStore
from convoq.usage import Usage


async def history(
    store: ClientStore, conversation_id: str, *, last_turns: int | None
) -> list[Message]:
    """The stored messages of a conversation (optionally its last ``last_turns`` turns)."""
    return await store.history(check_conversation_id(conversation_id), last_turns=last_turns)


async def usage(store: ClientStore, conversation_id: str) -> Usage:
    """Tokens the conversation's stored turns reported, summed (one read)."""
    return await store.usage(check_conversation_id(conversation_id))


async def clear(store: ClientStore, conversation_id: str, *, force: bool) -> None:
    """Delete a conversation (refused while a turn runs, unless ``force``)."""
    await store.clear(check_conversation_id(conversation_id), force=force)

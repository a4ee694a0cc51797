"""How an integration writes: as a turn of its own, under the conversation's reservation."""

from __future__ import annotations

import secrets

from convoq.memory import ConversationMemory
from convoq.messages import Message


async def append_as_a_turn(
    memory: ConversationMemory, conversation_id: str, messages: list[Message], wait_s: float
) -> None:
    """Append ``messages`` in one write, holding the conversation the way a convoq turn
    does (on Redis its lease, which workers and in-process Agents take): one writer per
    conversation across processes.

    Raises:
        ConversationBusyError: a convoq turn of the conversation still ran (or was queued)
            after ``wait_s`` seconds; nothing was written.
    """
    token = secrets.token_hex(16)
    await memory.areserve(conversation_id, token, wait_s=wait_s)
    try:
        await memory.acommit_turn(conversation_id, token, messages)
    except BaseException:
        # A refused commit (too large, say) must not leave the conversation held until
        # its lease expires; freeing a token no longer holding it changes nothing.
        await memory.arelease(conversation_id, token)
        raise

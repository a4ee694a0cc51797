"""Removing a conversation's newest message: the checks every backend shares, and the
rewrite that serves a memory with no atomic pop of its own.

convoq's backends pop in one atomic step (in-memory and file under their lock while the
pop holds the conversation's reservation; Redis in one script that refuses while a turn
holds the lease). A memory that implements only the guide's ``load``/``append``/``clear``
gets :func:`rewrite_without_newest` instead: those three methods are all it promises, so
the pop is a rewrite (load, clear, append back turn by turn) under the reservation the
pop holds, which keeps out every writer through that memory object (turns, sessions) but
not another process writing the same store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from convoq.errors import ConvoqError, InvalidMessageError
from convoq.ids import check_conversation_id
from convoq.messages import Message
from convoq.summary import Summary
from convoq.window import split_turns

if TYPE_CHECKING:
    from convoq.memory.base import ConversationMemory

Keep = Callable[[Message], list[Message]]
"""Given the newest message, the messages stored in its place ([]: nothing)."""


def check_pop(conversation_id: str, wait_s: float, keep: Keep | None) -> None:
    """Raise before any I/O on a bad argument of a pop."""
    check_conversation_id(conversation_id)
    if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) or not wait_s >= 0:
        raise ConvoqError(f"wait_s must be a number of seconds >= 0, not {wait_s!r}")
    if keep is not None and not callable(keep):
        raise ConvoqError(f"keep must be a function of the newest message or None, not {keep!r}")


def kept_in_place(keep: Keep | None, newest: Message) -> list[Message]:
    """What ``keep`` stores in place of ``newest``, checked before anything is written."""
    if keep is None:
        return []
    kept = keep(newest)
    if not isinstance(kept, list) or not all(isinstance(m, Message) for m in kept):
        raise InvalidMessageError(
            "keep must return a list of Message (the messages stored in place of the"
            f" newest one), not {type(kept).__name__}",
            rule="type",
        )
    return kept


def covers_newest_turn(messages: list[Message], summary: Summary | None) -> bool:
    """Whether ``summary`` tells of the turn holding the newest of ``messages`` (a pop then
    drops it: what it summarised is no longer all stored)."""
    if summary is None:
        return False
    turns = split_turns(messages)[1]
    return bool(turns) and summary.watermark >= len(turns)


async def rewrite_without_newest(
    memory: ConversationMemory, conversation_id: str, keep: Keep | None
) -> Message | None:
    """Pop by rewriting: the caller holds the conversation's reservation."""
    messages = await memory.aload(conversation_id)
    if not messages:
        return None
    newest = messages[-1]
    rest = messages[:-1] + kept_in_place(keep, newest)
    await memory.aclear(conversation_id)
    try:
        await _append_by_turn(memory, conversation_id, rest)
    except BaseException:
        # Put back what was there rather than leave a partial conversation.
        await memory.aclear(conversation_id)
        await _append_by_turn(memory, conversation_id, messages)
        raise
    return newest


async def _append_by_turn(
    memory: ConversationMemory, conversation_id: str, messages: list[Message]
) -> None:
    """Append turn by turn: ``append`` takes the messages of one turn."""
    lead, turns = split_turns(messages)
    chunks = [lead + turns[0], *turns[1:]] if turns else [lead]
    for chunk in chunks:
        if chunk:
            await memory.aappend(conversation_id, chunk)

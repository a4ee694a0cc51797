"""Split history into turns and keep the last N of them (what is *sent*, not stored)."""

from __future__ import annotations

from convoq.errors import ConvoqError
from convoq.messages import Message, MessageRole

_LEADING_ROLES = (MessageRole.SYSTEM, MessageRole.DEVELOPER)


def split_turns(messages: list[Message]) -> tuple[list[Message], list[list[Message]]]:
    """Return (leading system/developer messages, turns).

    A turn starts at a user message and runs to the next one. Messages before the first
    user message that are not system/developer open a turn of their own, so nothing is lost.
    """
    lead: list[Message] = []
    turns: list[list[Message]] = []
    index = 0
    while index < len(messages) and messages[index].role in _LEADING_ROLES:
        lead.append(messages[index])
        index += 1
    for message in messages[index:]:
        if message.role == MessageRole.USER or not turns:
            turns.append([message])
        else:
            turns[-1].append(message)
    return lead, turns


def last_turns(messages: list[Message], keep: int | None) -> list[Message]:
    """Leading system/developer messages plus the last ``keep`` whole turns.

    ``keep`` of ``None`` or ``0`` keeps everything.
    """
    if not keep:
        return list(messages)
    if keep < 0:
        raise ConvoqError("keep_last_turns must be >= 0 (0 keeps every turn)")
    lead, turns = split_turns(messages)
    kept = [m for turn in turns[-keep:] for m in turn]
    return lead + kept

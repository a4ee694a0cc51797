"""The one gate for conversation and turn ids before they reach a Redis key or a path."""

from __future__ import annotations

import re
import secrets
import time

from convoq.errors import InvalidConversationIdError

_CONVERSATION_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,256}")
# Turn ids are ours (see new_turn_id) but also arrive from clients, so they are checked too.
_TURN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_conversation_id(value: object) -> str:
    """Return ``value`` if it is a valid conversation id, else raise.

    Raises:
        InvalidConversationIdError: not a string of 1-256 chars of ``[A-Za-z0-9._:@/+=-]``.
    """
    if not isinstance(value, str) or not _CONVERSATION_ID.fullmatch(value):
        shown = repr(value)[:80]
        raise InvalidConversationIdError(
            f"invalid conversation id {shown}: use 1-256 characters of A-Z a-z 0-9 . _ : @ / + = -",
            conversation_id=shown,
        )
    return value


def check_turn_id(value: object) -> str:
    """Return ``value`` if it is a valid turn id, else raise."""
    if not isinstance(value, str) or not _TURN_ID.fullmatch(value):
        shown = repr(value)[:80]
        raise InvalidConversationIdError(
            f"invalid turn id {shown}: use 1-64 characters of A-Z a-z 0-9 _ -", turn_id=shown
        )
    return value


def new_turn_id() -> str:
    """A fresh turn id: time-ordered (ms, hex) then random, so ids sort by creation."""
    return f"{time.time_ns() // 1_000_000:012x}{secrets.token_hex(8)}"

"""The one gate for conversation and turn ids before they reach a Redis key or a path.

A conversation id is any string of 1-256 characters without control characters: spaces,
quotes, braces, slashes, ``..`` and non-ASCII letters are all fine. It never reaches a key
or a file name as is: :func:`key_part` encodes it (Redis keys), and the file backend
derives a sanitised name plus a hash of the id, so two ids never share storage.
"""

from __future__ import annotations

import functools
import re
import secrets
import time
import unicodedata
from typing import TypeGuard
from urllib.parse import quote, unquote

from convoq.errors import InvalidConversationIdError

MAX_CONVERSATION_ID_CHARS = 256
# Turn ids are ours (see new_turn_id) but also arrive from clients, so they are checked too.
_TURN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Kept as is inside a key: the characters ids were limited to before any id was allowed,
# so keys of conversations stored back then are unchanged. Everything else (``%`` first of
# all) becomes ``%XX`` of its UTF-8 bytes: no brace can break the ``{cid}`` hash tag, no
# glob character can widen a SCAN pattern, and the encoding is one-to-one.
_KEY_SAFE = "._:@/+=-"


def check_conversation_id(value: object) -> str:
    """Return ``value`` if it is a valid conversation id, else raise.

    Raises:
        InvalidConversationIdError: not a string of 1-256 characters, or it holds a
            control character (or a lone surrogate, which no storage can encode).
    """
    # Only exact str of a valid length through the cache: a str subclass could hash or
    # compare unlike a str, and a huge string must not be kept.
    cached = type(value) is str and len(value) <= MAX_CONVERSATION_ID_CHARS
    why = _problem(value) if cached else _uncached_problem(value)
    if why is not None:
        raise _invalid(value, why)
    return value  # type: ignore[return-value]  # _problem checked it is a str


# Every read and write checks the id, and each of its keys encodes it again: the answers
# for recent ids are remembered (4096 ids of at most 256 characters: about 1 MB at worst).
@functools.lru_cache(maxsize=4096)
def _problem(value: str) -> str | None:
    return _uncached_problem(value)


def _uncached_problem(value: object) -> str | None:
    """Why ``value`` is no conversation id, or None if it is one."""
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_CONVERSATION_ID_CHARS:
        return "it is not a string" if not isinstance(value, str) else "of its length"
    for char in value:
        if unicodedata.category(char) in ("Cc", "Cs"):
            return f"it holds the control character {char!r}"
    return None


def _invalid(value: object, why: str) -> InvalidConversationIdError:
    shown = repr(value)[:80]
    return InvalidConversationIdError(
        f"invalid conversation id {shown} ({why}): use a string of 1-256 characters without"
        " control characters",
        conversation_id=shown,
    )


def key_part(conversation_id: str) -> str:
    """The conversation id as it appears inside a Redis key (checked, then encoded)."""
    if type(conversation_id) is str:
        return _encoded(conversation_id)
    return quote(check_conversation_id(conversation_id), safe=_KEY_SAFE)


@functools.lru_cache(maxsize=4096)
def _encoded(conversation_id: str) -> str:
    # Cached for the reason _problem is; an invalid id raises and is not remembered.
    return quote(check_conversation_id(conversation_id), safe=_KEY_SAFE)


def from_key_part(part: str) -> str | None:
    """The conversation id :func:`key_part` encoded, or None if ``part`` is none."""
    try:
        cid = unquote(part, errors="strict")
    except UnicodeDecodeError:
        return None
    try:
        check_conversation_id(cid)
    except InvalidConversationIdError:
        return None
    return cid if key_part(cid) == part else None


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


def is_label(value: object, max_chars: int) -> TypeGuard[str]:
    """Whether ``value`` is a short name a person or system gives (a signal's name, who
    decided): a str of 1 to ``max_chars`` characters with no control character."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= max_chars
        and not any(ord(ch) < 32 or ord(ch) == 127 for ch in value)
    )

"""History in Redis: window loads and appends, shared by the memory backend and the protocol."""

from __future__ import annotations

from typing import Any

from convoq.errors import CorruptDataError, UnsupportedFormatVersionError
from convoq.limits import Limits
from convoq.messages import Message, MessageRole
from convoq.redis._codec import (
    FORMAT_VERSION,
    Encoded,
    check_turn_size,
    decode_elements,
    encode_element,
    pairs_to_dict,
    text,
)
from convoq.redis.keys import KeySchema
from convoq.redis.scripts import Scripts
from convoq.window import last_turns as window_last_turns
from convoq.window import split_turns


def stored_data_error(
    code: str, reply: list[Any], keys: KeySchema, cid: str
) -> CorruptDataError | UnsupportedFormatVersionError | None:
    """The error for a 'VERSION' or 'CORRUPT' script reply, else None."""
    if code == "VERSION":
        found = text(reply[1])
        return UnsupportedFormatVersionError(
            f"conversation {cid!r} is stored in format version {found!r} but this convoq reads"
            f" version {FORMAT_VERSION}; upgrade convoq or migrate the data",
            key=keys.meta(cid),
            format_version=found,
        )
    if code == "CORRUPT":
        key = text(reply[1])
        return CorruptDataError(
            f"stored data in {key} does not parse; restore it from a backup or clear the"
            " conversation",
            key=key,
        )
    return None


def decode_window(
    keys: KeySchema,
    cid: str,
    lead: list[bytes],
    elements: list[bytes],
    pairs: list[Any],
    window: int | None,
) -> list[Message]:
    """Messages of a load: the lead, then the window's elements, cut to ``window`` turns."""
    blobs = pairs_to_dict(pairs)
    blobs_key = keys.blobs(cid)
    messages = decode_elements(lead, blobs, key=keys.lead(cid), blobs_key=blobs_key)
    messages += decode_elements(elements, blobs, key=keys.turns(cid), blobs_key=blobs_key)
    return window_last_turns(messages, window or None)


async def load_history(
    scripts: Scripts, keys: KeySchema, cid: str, last_turns: int | None
) -> list[Message]:
    """Leading system/developer messages plus the last ``last_turns`` turns (None: all),
    in one round trip: the window's elements and their blobs."""
    window = last_turns or 0
    reply = await scripts.run("load", keys.history_keys(cid), [window])
    error = stored_data_error(reply[0], reply, keys, cid)
    if error is not None:
        raise error
    return decode_window(keys, cid, reply[1], reply[2], reply[3], window)


async def append_history(
    scripts: Scripts, keys: KeySchema, cid: str, messages: list[Message], limits: Limits
) -> None:
    """Append messages in one atomic script, O(size of the messages).

    Whole turns become one element each; leading system/developer messages join the lead
    list while the history has no turn yet, else (like any message before the first user
    message) they continue the last stored turn.
    """
    lead, turns = split_turns(messages)
    encoded = Encoded()
    lead_element = encode_element(lead, limits, encoded) if lead else b""
    orphan = b""
    if turns and turns[0][0].role != MessageRole.USER:
        orphan = encode_element(turns[0], limits, encoded)
        turns = turns[1:]
    elements = [encode_element(turn, limits, encoded) for turn in turns]
    check_turn_size(encoded, limits)
    args: list[Any] = [lead_element, orphan, len(elements), *elements, *encoded.blob_args()]
    reply = await scripts.run("append", keys.history_keys(cid), args)
    error = stored_data_error(reply[0], reply, keys, cid)
    if error is not None:
        raise error

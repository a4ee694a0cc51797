"""Token-budget windows on Redis, chosen without reading the whole history.

The ``window`` script walks a conversation's turn elements from the newest back, summing
the token count each element's header carries (``w=N``, the default counter's count, see
:mod:`convoq.redis._codec`), and answers the index range of the newest whole turns that
fit. Only that range is then read (in bounded chunks) with its blobs: the cost depends on
the window, not on the length of the history. Written once as steps
(:mod:`convoq.redis.scripts`), run by async and sync callers alike.
"""

from __future__ import annotations

from typing import Any

from convoq.errors import ConversationMemoryError
from convoq.messages import Message
from convoq.redis._codec import (
    FORMAT_VERSION,
    blob_refs,
    decode_elements,
    pairs_to_dict,
    parse_header,
    text,
)
from convoq.redis._decoded import process_cache
from convoq.redis._history import (
    CHUNK,
    _blobs_steps,
    _raise_stored_errors,
    plain_window_steps,
)
from convoq.redis._refusals import cleared_while_read, refusal_error, version_error
from convoq.redis._replies import WindowReply
from convoq.redis.keys import KeySchema
from convoq.redis.scripts import Batch, ScriptCall, Steps

_MAX_CALLS = 1000
_RESTARTS = 5


# A budget no history reaches: windows that only honour a summary.
UNLIMITED = 1 << 52


Inline = tuple[list[bytes], list[bytes], list[Any]]


def range_steps(
    keys: KeySchema, cid: str, budget: int, keep: int, with_summary: bool = False
) -> Steps[tuple[int, int, str | None, Inline | None]]:
    """``(first, last)`` element indexes of the window (``first > last``: no turn fits),
    ``with_summary`` the stored summary's text, and the lead, window elements and blob
    pairs when the script sent them along (a short window: one round trip in all)."""
    script_keys = [keys.meta(cid), keys.turns(cid), keys.lead(cid), keys.summary(cid)]
    script_keys.append(keys.blobs(cid))
    args: list[Any] = [budget, keep, -1, 0, 0, "", "1" if with_summary else "0"]
    summary: str | None = None  # read by the first call only
    for _ in range(_MAX_CALLS):
        answer = WindowReply.parse((yield ScriptCall("window", script_keys, args)))
        if answer.refusal is not None:
            raise refusal_error(answer.refusal, keys, cid, None)
        summary = answer.summary if answer.summary is not None else summary
        if answer.done:
            return answer.first, answer.last, summary, answer.inline
        args = [budget, *answer.resume, "0"]
    raise ConversationMemoryError(f"the window of conversation {cid!r} did not settle")


def budget_steps(
    keys: KeySchema, cid: str, budget: int | None, keep: int, with_summary: bool = False
) -> Steps[list[Message]]:
    """The lead (then, ``with_summary``, the summary) plus the newest whole turns (at most
    ``keep``, 0: any number; never one the summary covers) that fit ``budget`` tokens by
    the counts stored with each element (None: any number)."""
    if budget is None and with_summary:
        plain = yield from plain_window_steps(keys, cid, keep, with_summary=True)
        if plain is not None:  # no summary stored: the last turns, as without one
            return plain
    limit = UNLIMITED if budget is None else budget
    for _ in range(_RESTARTS):
        first, last, summary, inline = yield from range_steps(keys, cid, limit, keep, with_summary)
        if inline is not None:
            read: tuple[list[Message], list[Message]] | None = _decode_inline(keys, cid, inline)
        else:
            read = yield from _range_steps(keys, cid, first, last)
        if read is not None:
            lead, turns = read
            middle = [Message.system(summary)] if summary is not None else []
            return lead + middle + turns
    raise cleared_while_read(cid)


def _decode_inline(
    keys: KeySchema, cid: str, inline: Inline
) -> tuple[list[Message], list[Message]]:
    lead, elements, pairs = inline
    blobs, blobs_key = pairs_to_dict(pairs), keys.blobs(cid)
    lead_headers = [parse_header(e, key=keys.lead(cid)) for e in lead]
    headers = [parse_header(e, key=keys.turns(cid)) for e in elements]
    cache, owner = process_cache(), keys.base(cid)
    lead_messages = decode_elements(
        lead_headers, blobs, key=keys.lead(cid), blobs_key=blobs_key, cache=cache, owner=owner
    )
    return lead_messages, decode_elements(
        headers, blobs, key=keys.turns(cid), blobs_key=blobs_key, cache=cache, owner=owner
    )


def _range_steps(
    keys: KeySchema, cid: str, first: int, last: int
) -> Steps[tuple[list[Message], list[Message]] | None]:
    """Lead and elements ``first..last`` decoded, or None when the list shrank meanwhile."""
    turns = keys.turns(cid)
    commands: list[tuple[Any, ...]] = [
        ("HGET", keys.meta(cid), "format_version"),
        ("LRANGE", keys.lead(cid), 0, -1),
        ("LLEN", turns),
    ]
    for start in range(first, last + 1, CHUNK):
        commands.append(("LRANGE", turns, start, min(start + CHUNK, last + 1) - 1))
    replies = yield Batch(commands, transaction=True)
    names = [keys.meta(cid), keys.lead(cid), turns] + [turns] * (len(replies) - 3)
    _raise_stored_errors(replies, names)
    version, lead, total = replies[0], replies[1], replies[2]
    if version is not None and text(version) != str(FORMAT_VERSION):
        raise version_error(keys, cid, text(version))
    elements = [element for chunk in replies[3:] for element in chunk]
    if total <= last or len(elements) != max(0, last - first + 1):
        return None
    lead_headers = [parse_header(e, key=keys.lead(cid)) for e in lead]
    headers = [parse_header(e, key=turns) for e in elements]
    blobs = yield from _blobs_steps(keys, cid, blob_refs([*lead_headers, *headers]))
    blobs_key = keys.blobs(cid)
    cache, owner = process_cache(), keys.base(cid)
    lead_messages = decode_elements(
        lead_headers, blobs, key=keys.lead(cid), blobs_key=blobs_key, cache=cache, owner=owner
    )
    return lead_messages, decode_elements(
        headers, blobs, key=turns, blobs_key=blobs_key, cache=cache, owner=owner
    )

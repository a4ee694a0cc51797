"""Token-budget windows on Redis counted by a caller's own counter (a tokenizer): the
stored per-turn counts are the default counter's, so here the turns are read from the
newest back, a chunk at a time, and counted until the budget is spent; older turns are
never read. Written once as steps, run by async and sync callers alike."""

from __future__ import annotations

from convoq.errors import ConversationMemoryError
from convoq.messages import Message
from convoq.redis._codec import (
    FORMAT_VERSION,
    Header,
    blob_refs,
    decode_elements,
    parse_header,
    text,
)
from convoq.redis._history import _blobs_steps, _raise_stored_errors
from convoq.redis._replies import version_error
from convoq.redis.keys import KeySchema
from convoq.redis.scripts import Batch, Steps
from convoq.window import Window, newest_fitting

_CHUNK = 64
_RESTARTS = 5


def counted_steps(keys: KeySchema, cid: str, window: Window) -> Steps[list[Message]]:
    """The lead plus the newest whole turns that fit ``window`` by its counter."""
    for _ in range(_RESTARTS):
        found = yield from _walk(keys, cid, window)
        if found is not None:
            return found
    raise ConversationMemoryError(
        f"the history of conversation {cid!r} kept being cleared while it was read; try again"
    )


def _head(keys: KeySchema, cid: str) -> Steps[tuple[list[Message], int]]:
    """The lead messages and the length of the turns list (format checked)."""
    turns_key, lead_key = keys.turns(cid), keys.lead(cid)
    head = yield Batch(
        [
            ("HGET", keys.meta(cid), "format_version"),
            ("LRANGE", lead_key, 0, -1),
            ("LLEN", turns_key),
        ],
        transaction=True,
    )
    _raise_stored_errors(head, [keys.meta(cid), lead_key, turns_key])
    if head[0] is not None and text(head[0]) != str(FORMAT_VERSION):
        raise version_error(keys, cid, text(head[0]))
    lead_headers = [parse_header(e, key=lead_key) for e in head[1]]
    lead = yield from _decoded(keys, cid, lead_headers, lead_key)
    return lead, int(head[2])


def _walk(keys: KeySchema, cid: str, window: Window) -> Steps[list[Message] | None]:
    turns_key = keys.turns(cid)
    lead, length = yield from _head(keys, cid)
    counter, keep = window.token_counter, window.keep_last_turns or 0
    budget = max(0, (window.max_tokens or 0) - (counter.count(lead) if lead else 0))
    kept: list[list[Message]] = []  # newest first
    costs: list[int] = []
    later: list[Message] = []  # elements continuing a turn whose start is not read yet
    end = length
    while end > 0 and (not keep or len(kept) < keep):
        start = max(0, end - _CHUNK)
        reply = yield Batch(
            [("LLEN", turns_key), ("LRANGE", turns_key, start, end - 1)], transaction=True
        )
        _raise_stored_errors(reply, [turns_key, turns_key])
        if reply[0] < length:
            return None  # cleared or pruned meanwhile: start over
        for offset in range(len(reply[1]) - 1, -1, -1):
            # Parsed one by one, newest first: an element older than the window is not.
            header = parse_header(reply[1][offset], key=turns_key)
            messages = yield from _decoded(keys, cid, [header], turns_key)
            later = messages + later
            if not (header.starts_turn or start + offset == 0):
                continue
            costs.insert(0, counter.count(later))
            if newest_fitting(costs, budget) < len(costs):
                return lead + [m for turn in reversed(kept) for m in turn]
            kept.append(later)
            later = []
            if keep and len(kept) >= keep:
                break
        end = start
    return lead + [m for turn in reversed(kept) for m in turn]


def _decoded(keys: KeySchema, cid: str, headers: list[Header], key: str) -> Steps[list[Message]]:
    blobs = yield from _blobs_steps(keys, cid, blob_refs(headers))
    return decode_elements(headers, blobs, key=key, blobs_key=keys.blobs(cid))

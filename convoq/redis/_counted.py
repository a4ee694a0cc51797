"""Token-budget windows on Redis counted by a caller's own counter (a tokenizer): the
stored per-turn counts are the default counter's, so here the turns are read from the
newest back, a chunk at a time, and counted until the budget is spent; older turns are
never read. What a turn sends (``with_summary``) also stops at the stored summary's
watermark, the summary counting against the budget. Written once as steps, run by async
and sync callers alike."""

from __future__ import annotations

from typing import Any

from convoq.messages import Message
from convoq.redis._codec import (
    FORMAT_VERSION,
    Header,
    blob_refs,
    decode_elements,
    parse_header,
    text,
)
from convoq.redis._decoded import process_cache
from convoq.redis._history import _blobs_steps, _raise_stored_errors
from convoq.redis._refusals import cleared_while_read, version_error
from convoq.redis.keys import KeySchema
from convoq.redis.scripts import Batch, Steps
from convoq.window import Window, newest_fitting

_CHUNK = 64
_RESTARTS = 5


def counted_steps(keys: KeySchema, cid: str, window: Window) -> Steps[list[Message]]:
    """The lead (then, ``window.with_summary``, the stored summary) plus the newest whole
    turns that fit ``window`` by its counter (never one the summary covers)."""
    for _ in range(_RESTARTS):
        found = yield from _walk(keys, cid, window)
        if found is not None:
            return found
    raise cleared_while_read(cid)


def _head(keys: KeySchema, cid: str, with_summary: bool) -> Steps[tuple[list[Message], int, int]]:
    """The lead messages (then, ``with_summary``, the stored summary), the length of the
    turns list (format checked) and how many of the newest turns may be sent at most (0:
    any number; -1: none, a summary covers them all)."""
    turns_key, lead_key = keys.turns(cid), keys.lead(cid)
    commands: list[tuple[Any, ...]] = [
        ("HGET", keys.meta(cid), "format_version"),
        ("LRANGE", lead_key, 0, -1),
        ("LLEN", turns_key),
    ]
    names = [keys.meta(cid), lead_key, turns_key]
    if with_summary:
        commands += [
            ("HMGET", keys.summary(cid), "text", "watermark"),
            ("HGET", keys.meta(cid), "turns"),
        ]
        names += [keys.summary(cid), keys.meta(cid)]
    head = yield Batch(commands, transaction=True)
    _raise_stored_errors(head, names)
    if head[0] is not None and text(head[0]) != str(FORMAT_VERSION):
        raise version_error(keys, cid, text(head[0]))
    lead_headers = [parse_header(e, key=lead_key) for e in head[1]]
    lead = yield from _decoded(keys, cid, lead_headers, lead_key)
    if not with_summary or head[3][0] is None:
        return lead, int(head[2]), 0
    summary_text, watermark = head[3]
    after = max(0, int(head[4] or 0) - int(watermark or 0))  # turns the summary leaves out
    return [*lead, Message.system(text(summary_text))], int(head[2]), after or -1


def _walk(keys: KeySchema, cid: str, window: Window) -> Steps[list[Message] | None]:
    turns_key = keys.turns(cid)
    lead, length, cap = yield from _head(keys, cid, window.with_summary)
    if cap < 0:
        return lead
    counter, keep = window.token_counter, window.keep_last_turns or 0
    keep = cap if cap and (not keep or keep > cap) else keep
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
    return decode_elements(
        headers,
        blobs,
        key=key,
        blobs_key=keys.blobs(cid),
        cache=process_cache(),
        owner=keys.base(cid),
    )

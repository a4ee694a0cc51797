"""History in Redis: window loads and appends, shared by the memory backend and the protocol.

Each read and write is written once as steps (:mod:`convoq.redis.scripts`), run on an
async client here and on a sync one by sync callers that skip the bridge loop.

A window of the last N turns comes from the ``load`` script in one round trip (it reads
only element headers inside Redis). A whole history, or a window longer than one script
call may read, is read by the client in chunks of :data:`CHUNK` elements: each call's
Redis time is bounded, so a long conversation never blocks Redis for other clients. The
turns list only grows at its end (RPUSH) until it is cleared, so the first ``n`` elements
read in chunks are the ones that were there when the read began; a clear meanwhile shows
as a shorter list and the read starts over.
"""

from __future__ import annotations

import secrets
from typing import Any

from redis.exceptions import ResponseError

from convoq._sync import adrive
from convoq.errors import (
    CorruptDataError,
)
from convoq.limits import Limits
from convoq.messages import Message, MessageRole
from convoq.redis._cluster import CLUSTER_UNAVAILABLE
from convoq.redis._codec import (
    FORMAT_VERSION,
    Encoded,
    Header,
    blob_refs,
    check_turn_size,
    counters_arg,
    decode_elements,
    encode_element,
    parse_header,
    plain_messages,
    text,
    usage_of,
)
from convoq.redis._decoded import process_cache
from convoq.redis._refusals import cleared_while_read, refusal_error, version_error
from convoq.redis._replies import AppendReply, LoadReply
from convoq.redis.keys import KeySchema
from convoq.redis.scripts import Batch, ScriptCall, Scripts, Steps
from convoq.window import last_turns as window_last_turns
from convoq.window import split_turns

# Elements (or blobs) per Redis call of a chunked read.
CHUNK = 1000
_BLOB_CHUNK = 200
_RESTARTS = 5
# Windows of at most this many turns are first tried by plain reads (INLINE_MAX in _lib.lua
# bounds what one script call reads; the same bound for one LRANGE).
PLAIN_WINDOW_MAX = 256
# How long an append id is remembered: far longer than redis-py's resends take.
APPEND_ID_TTL_MS = 3_600_000


def decode_window(
    keys: KeySchema,
    cid: str,
    lead: list[bytes],
    elements: list[bytes],
    blobs: dict[str, bytes],
) -> list[Message]:
    """Messages of a load: the lead, then the window's elements (whole turns: the script
    stops at the element that starts the window's first turn, and element headers mark
    turn starts exactly where :func:`~convoq.window.split_turns` does, so no cut is
    needed here)."""
    lead_headers = [parse_header(e, key=keys.lead(cid)) for e in lead]
    headers = [parse_header(e, key=keys.turns(cid)) for e in elements]
    return decode_stored(keys, cid, lead_headers, headers, blobs)


def decode_stored(
    keys: KeySchema,
    cid: str,
    lead_headers: list[Header],
    headers: list[Header],
    blobs: dict[str, bytes],
) -> list[Message]:
    """The messages of the lead's then the turns' elements, those read before in this
    process from its decoded turns (:func:`~convoq.redis._decoded.process_cache`)."""
    cache, owner, blobs_key = process_cache(), keys.base(cid), keys.blobs(cid)
    messages = decode_elements(
        lead_headers, blobs, key=keys.lead(cid), blobs_key=blobs_key, cache=cache, owner=owner
    )
    messages += decode_elements(
        headers, blobs, key=keys.turns(cid), blobs_key=blobs_key, cache=cache, owner=owner
    )
    return messages


def load_steps(keys: KeySchema, cid: str, last_turns: int | None) -> Steps[list[Message]]:
    """Leading system/developer messages plus the last ``last_turns`` turns (None: all):
    a window in one round trip, a whole history in bounded chunks."""
    window = last_turns or 0
    if window > 0:
        plain = yield from plain_window_steps(keys, cid, window)
        if plain is not None:
            return plain
        loaded = LoadReply.parse((yield ScriptCall("load", keys.history_keys(cid), [window])))
        if loaded.refusal is not None:
            raise refusal_error(loaded.refusal, keys, cid, None)
        if loaded.elements is not None:
            return decode_window(keys, cid, loaded.lead, loaded.elements, loaded.blobs)
    return (yield from chunked_steps(keys, cid, window))


def plain_window_steps(
    keys: KeySchema, cid: str, window: int, *, with_summary: bool = False
) -> Steps[list[Message] | None]:
    """The last ``window`` turns by plain reads in one MULTI/EXEC (no script: a script
    call alone costs Redis more than these reads), when what they find is the common
    case: every element read starts a turn (or the whole list was read) and none refers to
    an attachment; ``with_summary``, also only while no summary is stored. Anything else
    (attachments, a turn stored in several elements, a summary, a malformed element) ends
    with None: a script then reads it. So does a window of more than
    :data:`PLAIN_WINDOW_MAX` turns, without reading anything here."""
    if not 0 < window <= PLAIN_WINDOW_MAX:
        return None
    meta, lead_key, turns_key = keys.meta(cid), keys.lead(cid), keys.turns(cid)
    commands: list[tuple[Any, ...]] = [
        ("HGET", meta, "format_version"),
        ("LRANGE", lead_key, 0, -1),
        ("LRANGE", turns_key, -window, -1),
    ]
    if with_summary:
        commands.append(("HGET", keys.summary(cid), "text"))
    replies = yield Batch(commands, transaction=True)
    _raise_stored_errors(replies, [meta, lead_key, turns_key, keys.summary(cid)][: len(replies)])
    version, lead, elements = replies[:3]
    if version is not None and text(version) != str(FORMAT_VERSION):
        raise version_error(keys, cid, text(version))
    if with_summary and replies[3] is not None:
        return None
    # Fewer elements than asked for: the whole list, whatever its first element starts.
    return plain_messages(
        lead,
        elements,
        starts_only=len(elements) == window,
        cache=process_cache(),
        owner=keys.base(cid),
    )


async def load_history(
    scripts: Scripts, keys: KeySchema, cid: str, last_turns: int | None
) -> list[Message]:
    """:func:`load_steps` on an async client."""
    return await adrive(load_steps(keys, cid, last_turns), scripts.perform)


def chunked_steps(keys: KeySchema, cid: str, window: int) -> Steps[list[Message]]:
    """The whole history read in chunks (each Redis call bounded), cut to ``window``."""
    for _ in range(_RESTARTS):
        read = yield from _elements_steps(keys, cid)
        if read is None:
            continue  # cleared while we read: start over
        lead, elements = read
        plain = plain_messages(
            lead, elements, starts_only=False, cache=process_cache(), owner=keys.base(cid)
        )
        if plain is not None:
            return window_last_turns(plain, window or None)
        headers = [parse_header(e, key=keys.turns(cid)) for e in elements]
        lead_headers = [parse_header(e, key=keys.lead(cid)) for e in lead]
        blobs = yield from _blobs_steps(keys, cid, blob_refs([*lead_headers, *headers]))
        messages = decode_stored(keys, cid, lead_headers, headers, blobs)
        return window_last_turns(messages, window or None)
    raise cleared_while_read(cid)


async def read_chunked(scripts: Scripts, keys: KeySchema, cid: str, window: int) -> list[Message]:
    """:func:`chunked_steps` on an async client."""
    return await adrive(chunked_steps(keys, cid, window), scripts.perform)


def _elements_steps(keys: KeySchema, cid: str) -> Steps[tuple[list[bytes], list[bytes]] | None]:
    """Lead and turn elements, or None when the list shrank meanwhile (a clear)."""
    turns = keys.turns(cid)
    first = yield Batch(
        [
            ("HGET", keys.meta(cid), "format_version"),
            ("LRANGE", keys.lead(cid), 0, -1),
            ("LLEN", turns),
            ("LRANGE", turns, 0, CHUNK - 1),
        ],
        transaction=True,
    )
    names = [keys.meta(cid), keys.lead(cid), turns, turns]
    _raise_stored_errors(first, names)
    version, lead, total, elements = first
    if version is not None and text(version) != str(FORMAT_VERSION):
        raise version_error(keys, cid, text(version))
    if total > len(elements):
        # The rest in one pipeline of bounded calls: other clients' commands run between them.
        rest = yield Batch(
            [
                ("LRANGE", turns, start, min(start + CHUNK, total) - 1)
                for start in range(len(elements), total, CHUNK)
            ]
        )
        _raise_stored_errors(rest, [turns] * len(rest))
        for chunk in rest:
            elements += chunk
    if len(elements) != total:
        return None
    return lead, elements


def _blobs_steps(keys: KeySchema, cid: str, refs: list[str]) -> Steps[dict[str, bytes]]:
    if not refs:
        return {}
    key = keys.blobs(cid)
    replies = yield Batch(
        [
            ("HMGET", key, *refs[start : start + _BLOB_CHUNK])
            for start in range(0, len(refs), _BLOB_CHUNK)
        ]
    )
    _raise_stored_errors(replies, [key] * len(replies))
    values = [value for reply in replies for value in reply]
    return {sha: value for sha, value in zip(refs, values, strict=True) if value is not None}


def _raise_stored_errors(replies: list[Any], keys: list[str]) -> None:
    """CorruptDataError naming the key of the first reply that is an error (WRONGTYPE); a
    cluster's "cannot serve this slot now" is raised as it is (Redis unavailable)."""
    for reply, key in zip(replies, keys, strict=True):
        if isinstance(reply, CLUSTER_UNAVAILABLE):
            raise reply
        if isinstance(reply, ResponseError):
            raise CorruptDataError(
                f"stored data in {key} cannot be read ({reply}); restore it from a backup or"
                " clear the conversation",
                key=key,
            )


def append_steps(
    keys: KeySchema,
    cid: str,
    messages: list[Message],
    limits: Limits,
    *,
    append_id: str | None = None,
    fence: int | None = None,
) -> Steps[bool]:
    """Append messages in one atomic script, O(size of the messages), exactly once per
    ``append_id`` (a fresh one when None): a resend after a lost reply writes nothing.

    Whole turns become one element each; leading system/developer messages join the lead
    list while the history has no turn yet, else (like any message before the first user
    message) they continue the last stored turn. With ``fence``, only the holder of that
    lease appends, and the lease is freed with the append. Ends with False when
    ``append_id`` was applied before (nothing written this time).

    Raises:
        StaleFenceError: ``fence`` is not the conversation's current lease.
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
    counters = counters_arg(usage_of(messages), messages)
    applied = keys.applied(cid, append_id or secrets.token_hex(16))
    args: list[Any] = [APPEND_ID_TTL_MS, "" if fence is None else fence, lead_element, orphan]
    args += [counters, len(elements), *elements, *encoded.blob_args()]
    script_keys = [*keys.history_keys(cid), applied, keys.lease(cid)]
    appended = AppendReply.parse((yield ScriptCall("append", script_keys, args)))
    if appended.refusal is not None:
        raise refusal_error(appended.refusal, keys, cid, None, fence)
    return appended.applied


async def append_history(
    scripts: Scripts,
    keys: KeySchema,
    cid: str,
    messages: list[Message],
    limits: Limits,
    *,
    append_id: str | None = None,
    fence: int | None = None,
) -> bool:
    """:func:`append_steps` on an async client."""
    steps = append_steps(keys, cid, messages, limits, append_id=append_id, fence=fence)
    return await adrive(steps, scripts.perform)

"""Stored messages as JSON, passed through: for reads that only forward a history (the
gateway's messages route, ``convoq export``) and so never need to decode it.

A stored element's body is exactly the JSON of its messages in convoq's one JSON form
(:func:`convoq.messages.messages_to_json`), and its header counts them (``n=``, see
:mod:`convoq.redis._codec`). So a history's JSON is its bodies joined, and a page of it
the bodies of the elements it covers, with no message decoded. Decoded (typed, through
the process's decoded turns) and dumped again are only the elements whose body is not
that JSON or whose count is unknown: those referring to attachments (their bytes live in
the blobs hash; the JSON carries them as base64), those stored before headers counted
messages (among them any holding a legacy record part, which a load moves: a message
made by this version has moved it already), and an element a page boundary cuts
through.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from convoq.messages import MessageList
from convoq.redis._codec import Header, blob_refs, parse_header
from convoq.redis._history import (
    _blobs_steps,
    _elements_steps,
    decode_stored,
)
from convoq.redis._refusals import cleared_while_read, refusal_error
from convoq.redis._replies import LoadReply
from convoq.redis.keys import KeySchema
from convoq.redis.scripts import ScriptCall, Steps

_RESTARTS = 5
_BLOBS, _COUNT = b" b=", b" n="
_OPEN, _CLOSE = ord("["), ord("]")


# ``count`` messages as JSON, joined by commas without brackets (b"" for none).
Run = tuple[int, bytes | memoryview]


@dataclass(frozen=True)
class StoredJson:
    """A history's messages as runs of JSON (see the module docstring)."""

    runs: tuple[Run, ...]

    @property
    def total(self) -> int:
        """How many messages."""
        return sum(count for count, _ in self.runs)

    def array(self, offset: int = 0, limit: int | None = None) -> bytes:
        """The JSON array of messages ``offset`` to ``offset + limit`` (None: to the end)."""
        end = self.total if limit is None else offset + limit
        pieces: list[bytes | memoryview] = []
        start = 0
        for count, json in self.runs:
            stop = start + count
            if stop > offset and start < end and count:
                if offset <= start and stop <= end:
                    pieces.append(json)
                else:
                    pieces += _split(json)[max(0, offset - start) : end - start]
            start = stop
        return b"[" + b",".join(pieces) + b"]"


def _split(json: bytes | memoryview) -> list[bytes]:
    """Each message of a run's JSON as its own JSON."""
    messages = MessageList.validate_json(b"[" + json + b"]")
    return [MessageList.dump_json([message])[1:-1] for message in messages]


def json_steps(keys: KeySchema, cid: str, last_turns: int | None) -> Steps[StoredJson]:
    """The lead and the last ``last_turns`` turns (None or 0: all) as :class:`StoredJson`."""
    window = last_turns or 0
    if window > 0:
        loaded = LoadReply.parse((yield ScriptCall("load", keys.history_keys(cid), [window])))
        if loaded.refusal is not None:
            raise refusal_error(loaded.refusal, keys, cid, None)
        if loaded.elements is not None:
            return _stored(keys, cid, loaded.lead, loaded.elements, loaded.blobs)
    for _ in range(_RESTARTS):
        read = yield from _elements_steps(keys, cid)
        if read is None:
            continue  # cleared while we read: start over
        lead, elements = read
        if window > 0:  # a window longer than one script call reads: cut by turn starts
            turns_key = keys.turns(cid)
            kept = _last_turns([parse_header(e, key=turns_key) for e in elements], window)
            elements = elements[len(elements) - len(kept) :]
        refs = _refs(keys, cid, lead, elements)
        blobs = yield from _blobs_steps(keys, cid, refs) if refs else _no_blobs()
        return _stored(keys, cid, lead, elements, blobs)
    raise cleared_while_read(cid)


def _no_blobs() -> Steps[dict[str, bytes]]:
    return {}
    yield  # a generator: nothing to read


def _refs(keys: KeySchema, cid: str, lead: list[bytes], elements: list[bytes]) -> list[str]:
    """The blobs the elements refer to (parsed only where a header names some)."""
    found = [
        parse_header(e, key=key)
        for key, group in ((keys.lead(cid), lead), (keys.turns(cid), elements))
        for e in group
        if e.find(_BLOBS, 0, max(0, e.find(b"\n"))) >= 0
    ]
    return blob_refs(found)


def _last_turns(headers: list[Header], window: int) -> list[Header]:
    """The elements of the last ``window`` turns (0: all); the first element starts a
    turn whatever its kind, as in :func:`convoq.window.split_turns`."""
    if window <= 0:
        return headers
    starts = [i for i, h in enumerate(headers) if h.starts_turn or i == 0]
    return headers[starts[-window] :] if len(starts) > window else headers


def _stored(
    keys: KeySchema,
    cid: str,
    lead: Sequence[bytes],
    turns: Sequence[bytes],
    blobs: dict[str, bytes],
) -> StoredJson:
    runs: list[Run] = []
    for index, element in enumerate([*lead, *turns]):
        run = _passed_through(element)
        if run is None:
            in_lead = index < len(lead)
            header = parse_header(element, key=keys.lead(cid) if in_lead else keys.turns(cid))
            both: tuple[list[Header], list[Header]] = ([header], []) if in_lead else ([], [header])
            messages = decode_stored(keys, cid, *both, blobs)
            run = len(messages), MessageList.dump_json(messages)[1:-1]
        runs.append(run)
    return StoredJson(tuple(runs))


def _passed_through(element: bytes) -> Run | None:
    """The element's body as a run, when it passes through: its header counts its
    messages (``n=``, last in the header, written by this version, whose messages never
    hold a legacy record part: a message moves it when it is made) and names no
    attachment, and its body is a JSON array; else None (it is decoded)."""
    newline = element.find(b"\n")
    at = element.rfind(_COUNT, 0, newline)
    if at < 0 or element[-1] != _CLOSE or element[newline + 1] != _OPEN:
        return None
    digits = element[at + 3 : newline]
    if not digits.isdigit() or element.find(_BLOBS, 0, at) >= 0 or len(element) - newline < 3:
        return None
    return int(digits), memoryview(element)[newline + 2 : -1]

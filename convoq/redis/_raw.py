"""Stored messages as JSON, passed through: for reads that only forward a history (the
gateway's messages route, ``convoq export``) and so never need to decode it.

A stored element's body is exactly the JSON of its messages in convoq's one JSON form
(:func:`convoq.messages.messages_to_json`), and its header counts them (``n=``, see
:mod:`convoq.redis._codec`). So a history's JSON is its bodies joined, and a page of it
the bodies of the elements it covers, with no message decoded. Decoded (typed, through
the process's decoded turns) and dumped again are only the elements whose body is not
that JSON or whose count is unknown: those referring to attachments (their bytes live in
the blobs hash; the JSON carries them as base64), those stored before headers counted
messages, those holding a legacy record part (a load moves it), and an element a page
boundary cuts through.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from convoq.messages import LEGACY_RECORD_MIME_TYPE, MessageList
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

_LEGACY = LEGACY_RECORD_MIME_TYPE.encode()
_RESTARTS = 5


@dataclass(frozen=True)
class Run:
    """``count`` messages as JSON, joined by commas without brackets (b"" for none);
    ``element``: the stored element, to split the run when a page starts or ends in it."""

    count: int
    json: bytes | memoryview
    element: Header | None = None


@dataclass(frozen=True)
class StoredJson:
    """A history's messages as runs of JSON (see the module docstring)."""

    runs: tuple[Run, ...]

    @property
    def total(self) -> int:
        """How many messages."""
        return sum(run.count for run in self.runs)

    def array(self, offset: int = 0, limit: int | None = None) -> bytes:
        """The JSON array of messages ``offset`` to ``offset + limit`` (None: to the end)."""
        end = self.total if limit is None else offset + limit
        pieces: list[bytes | memoryview] = []
        start = 0
        for run in self.runs:
            stop = start + run.count
            if stop > offset and start < end and run.count:
                if offset <= start and stop <= end:
                    pieces.append(run.json)
                else:
                    pieces += _split(run)[max(0, offset - start) : end - start]
            start = stop
        return b"[" + b",".join(pieces) + b"]"


def _split(run: Run) -> list[bytes]:
    """Each message of ``run`` as its own JSON."""
    messages = MessageList.validate_json(b"[" + run.json + b"]")
    return [MessageList.dump_json([message])[1:-1] for message in messages]


def json_steps(keys: KeySchema, cid: str, last_turns: int | None) -> Steps[StoredJson]:
    """The lead and the last ``last_turns`` turns (None or 0: all) as :class:`StoredJson`."""
    window = last_turns or 0
    if window > 0:
        loaded = LoadReply.parse((yield ScriptCall("load", keys.history_keys(cid), [window])))
        if loaded.refusal is not None:
            raise refusal_error(loaded.refusal, keys, cid, None)
        if loaded.elements is not None:
            lead = [parse_header(e, key=keys.lead(cid)) for e in loaded.lead]
            turns = [parse_header(e, key=keys.turns(cid)) for e in loaded.elements]
            return _stored(keys, cid, lead, turns, loaded.blobs)
    for _ in range(_RESTARTS):
        read = yield from _elements_steps(keys, cid)
        if read is None:
            continue  # cleared while we read: start over
        lead = [parse_header(e, key=keys.lead(cid)) for e in read[0]]
        turns = _last_turns([parse_header(e, key=keys.turns(cid)) for e in read[1]], window)
        blobs = yield from _blobs_steps(keys, cid, blob_refs([*lead, *turns]))
        return _stored(keys, cid, lead, turns, blobs)
    raise cleared_while_read(cid)


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
    lead: Sequence[Header],
    turns: Sequence[Header],
    blobs: dict[str, bytes],
) -> StoredJson:
    runs: list[Run] = []
    for index, header in enumerate([*lead, *turns]):
        count = _count(header)
        if count is not None:
            runs.append(Run(count, header.body[1:-1], header))
            continue
        in_lead = index < len(lead)
        messages = decode_stored(
            keys, cid, [header] if in_lead else [], [] if in_lead else [header], blobs
        )
        runs.append(Run(len(messages), MessageList.dump_json(messages)[1:-1]))
    return StoredJson(tuple(runs))


def _count(header: Header) -> int | None:
    """How many messages the element's body holds as they are sent, or None when the body
    is not passed through (see the module docstring)."""
    body = header.body
    if (
        header.messages is None
        or header.blobs
        or len(body) < 2
        or body[0] != ord("[")
        or body[-1] != ord("]")
        or header.element.find(_LEGACY) >= 0
    ):
        return None
    return header.messages

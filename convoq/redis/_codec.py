"""Turn elements and blobs: how messages are laid out in Redis (format_version 2).

A stored element is one line of header, a newline, then the body::

    T b=<sha256>,<sha256>\n[{"role":"user",...},{"role":"assistant",...}]

The header is ASCII: its first character says whether the element starts a turn (``T``:
its first message is a user message) or continues the element before it (``C``; also
every element of the lead list), followed by zero or more `` name=value`` fields. Readers
skip fields they do not know, so a field can be added without a new format version:

    ``b=sha,sha,...``   the attachments the body refers to (absent: none)
    ``t=N``             on a turn's element: the tokens the model counted for what the
                        turn added after its user message (:func:`convoq.usage.turn_tokens`;
                        absent when its calls reported no usage).
    ``w=N``             what the default token counter
                        (:class:`convoq.tokens.RecordedTokenCounter`: ``t`` plus an
                        estimate of the user message, else an estimate of it all) makes of
                        the element: the ``window`` script sums these to choose a
                        token-budget window from headers alone (absent on elements stored
                        before it existed: a token per 4 bytes is assumed).
    ``n=N``             how many messages the body holds, so a read that only forwards
                        the JSON (:mod:`convoq.redis._raw`) can page it without decoding
                        (absent on elements stored before it existed: they are decoded).

The body is the JSON array of the element's messages, exactly :class:`Message`'s JSON,
except that an attachment part's ``data`` is replaced by ``"blob": sha256hex``; the bytes
live once per conversation in the ``blobs`` hash. So Lua finds turn boundaries and blob
refs from the header alone (no JSON decoding inside Redis), and the client decodes runs of
elements without attachments with compiled pydantic ``validate_json`` calls (a chunk of
elements each).

Format changelog (the ``format_version`` field of the meta hash; any other value is
refused with UnsupportedFormatVersionError, and nothing is written):
  1: turn elements as JSON objects ``{"blobs": [...], "messages": [...]}`` + lead list +
     blobs hash; Lua decoded every element to find turn starts and blob refs.
  2: a header line before each element's JSON array (turn start, blob refs, room for
     more fields); bodies decode with pydantic's compiled JSON validation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from convoq.errors import CorruptDataError
from convoq.limits import Limits, attachment_too_large, turn_too_large
from convoq.messages import (
    Message,
    MessageList,
    MessageRole,
    TextPart,
    shared_message,
    with_shared_field_sets,
)
from convoq.redis._decoded import DecodedTurns, Turn
from convoq.tokens import DEFAULT_COUNTER
from convoq.usage import (
    COUNTER_FIELDS,
    Usage,
    model_counters,
    turn_tokens,
    turn_usage,
    usage_by_model,
)

FORMAT_VERSION = 2
_STARTS, _CONTINUES = b"T", b"C"
_BLOBS_FIELD = b"b="
_TOKENS_FIELD = b"t="
_WINDOW_FIELD = b"w="
_COUNT_FIELD = b"n="
# What plain_messages looks for: a header's first byte, and its attachments field.
_ANY_KIND = frozenset(_STARTS + _CONTINUES)
_BLOBS_MARK = b" " + _BLOBS_FIELD
# A body is a JSON array: its brackets are checked, then stripped to join bodies in one.
_OPEN, _CLOSE = ord("["), ord("]")


@dataclass
class Encoded:
    """Elements ready for a script: encoded bytes plus the blobs they refer to."""

    elements: list[bytes] = field(default_factory=list)
    blobs: dict[str, bytes] = field(default_factory=dict)

    def blob_args(self) -> list[bytes | str]:
        """sha, bytes, sha, bytes, ...: the tail of a script's ARGV."""
        args: list[bytes | str] = []
        for sha, data in self.blobs.items():
            args += [sha, data]
        return args


def encode_element(messages: list[Message], limits: Limits, into: Encoded) -> bytes:
    """Encode one element (header line + body), add its blobs to ``into``, return it."""
    kind = _STARTS if messages and messages[0].role == MessageRole.USER else _CONTINUES
    tokens = turn_tokens(messages) if kind == _STARTS else None
    head = kind if tokens is None else kind + b" " + _TOKENS_FIELD + b"%d" % tokens
    # Last in the header: the fields added after the others existed (the window script's
    # token estimate, the message count).
    window = b" %s%d %s%d" % (
        _WINDOW_FIELD,
        DEFAULT_COUNTER.count(messages),
        _COUNT_FIELD,
        len(messages),
    )
    if not any(m.attachments for m in messages):
        element = head + window + b"\n" + MessageList.dump_json(messages)
        into.elements.append(element)
        return element
    refs: list[str] = []
    out: list[dict[str, Any]] = []
    for message in messages:
        data = message.model_dump(mode="json", exclude={"content"})
        parts: list[dict[str, Any]] = []
        for part in message.content:
            if isinstance(part, TextPart):
                parts.append(part.model_dump(mode="json"))
                continue
            _check_attachment(len(part.data), limits)
            sha = hashlib.sha256(part.data).hexdigest()
            into.blobs[sha] = part.data
            if sha not in refs:
                refs.append(sha)
            dumped = part.model_dump(mode="json", exclude={"data"})
            dumped["blob"] = sha
            parts.append(dumped)
        data["content"] = parts
        out.append(data)
    header = head + b" " + _BLOBS_FIELD + ",".join(refs).encode("ascii") + window
    body = json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    element = header + b"\n" + body
    into.elements.append(element)
    return element


def usage_of(messages: list[Message]) -> Usage:
    """The usage stored messages add to their conversation's counters: what their model
    calls reported, each assistant message counted as one call."""
    calls = sum(m.role == MessageRole.ASSISTANT for m in messages)
    return turn_usage(messages, requests=calls)


def counters_arg(usage: Usage, messages: Sequence[Message] = ()) -> str:
    """The usage counters a script adds to the meta hash: ``{field: count}`` JSON, the
    conversation's sums and, per model that ``messages`` name, that model's."""
    dumped = usage.model_dump()
    counters = {COUNTER_FIELDS[name]: n for name, n in dumped.items() if n}
    counters.update(model_counters(usage_by_model(messages)))
    return json.dumps(counters)


def check_turn_size(encoded: Encoded, limits: Limits) -> None:
    """Raise if the elements plus their blobs exceed ``max_turn_bytes``."""
    size = sum(len(e) for e in encoded.elements) + sum(len(b) for b in encoded.blobs.values())
    if size > limits.max_turn_bytes:
        raise turn_too_large(size, limits)


def _check_attachment(size: int, limits: Limits) -> None:
    if size > limits.max_attachment_bytes:
        raise attachment_too_large(size, limits)


def check_message_limits(message: Message, limits: Limits) -> bytes:
    """Check one message's attachments and total size; return its JSON (bytes as base64)."""
    for part in message.attachments:
        _check_attachment(len(part.data), limits)
    raw = message.model_dump_json().encode("utf-8")
    if len(raw) > limits.max_turn_bytes:
        raise turn_too_large(len(raw), limits, "the message as JSON")
    return raw


@dataclass(frozen=True)
class Header:
    """What an element's header line says."""

    starts_turn: bool
    blobs: tuple[str, ...]
    body: memoryview  # the JSON array after the header line
    tokens: int | None = None  # the t= field: see the module docstring
    element: bytes = b""  # the whole stored element (what decoded turns are kept by)
    messages: int | None = None  # the n= field: see the module docstring


def parse_header(element: bytes, *, key: str) -> Header:
    """The header of a stored element; CorruptDataError naming ``key`` if it has none."""
    newline = element.find(b"\n")
    kind = element[:1]
    if newline < 1 or kind not in (_STARTS, _CONTINUES):
        raise _corrupt(key, "no element header")
    blobs: tuple[str, ...] = ()
    tokens: int | None = None
    count: int | None = None
    for item in element[1:newline].split():
        if item.startswith(_BLOBS_FIELD):
            blobs = tuple(item[2:].decode("ascii").split(","))
        elif item.startswith(_TOKENS_FIELD) and item[2:].isdigit():
            tokens = int(item[2:])
        elif item.startswith(_COUNT_FIELD) and item[2:].isdigit():
            count = int(item[2:])
    body = memoryview(element)[newline + 1 :]
    return Header(kind == _STARTS, blobs, body, tokens, element, count)


def blob_refs(headers: Iterable[Header]) -> list[str]:
    """Every blob sha the headers name, each once, in order."""
    return list(dict.fromkeys(sha for header in headers for sha in header.blobs))


# Elements (each a JSON array of messages) decoded in a compiled call: a list of lists.
_ELEMENTS = TypeAdapter(list[list[Message]])
# Elements per compiled call. A message of one text part decodes to seven objects the
# garbage collector tracks; two are pydantic's field sets (and, kept shared, the empty
# tool_calls list), which go once the message shares them. Shared a chunk at a time, they
# go while the chunk is young, before they pile up: a decode of 10,000 turns then holds
# 5 objects a message, not 7, and sets off one full collection (a walk of the whole
# process's heap), not two (bench gc).
_CHUNK = 32


def decode_elements(
    headers: list[Header],
    blobs: dict[str, bytes],
    *,
    key: str,
    blobs_key: str,
    cache: DecodedTurns | None = None,
    owner: str = "",
) -> list[Message]:
    """Messages of stored elements, attachment bytes restored from ``blobs``. Elements
    without attachments are validated together, ``_CHUNK`` to a ``validate_json`` call. With
    ``cache``, elements of conversation ``owner`` decoded before come from it and those
    decoded now join it (shared, read-only messages); without, every message is new."""
    elements = [header.element for header in headers]
    found: list[Turn | None] = (
        cache.lookup(owner, elements) if cache is not None else [None] * len(headers)
    )
    try:
        plain = [i for i, turn in enumerate(found) if turn is None and not headers[i].blobs]
        compact = _compacting(cache, len(plain))
        bodies = [headers[i].body for i in plain]
        decoded = dict(zip(plain, _validate_bodies(bodies, compact), strict=True))
        sizes = dict.fromkeys(decoded, 0)
        for i, turn in enumerate(found):
            if turn is None and i not in decoded:
                decoded[i] = _with_blobs(headers[i].body, blobs, blobs_key)
                if cache is not None:
                    decoded[i] = [shared_message(m) for m in decoded[i]]
                sizes[i] = sum(len(blobs.get(sha, b"")) for sha in headers[i].blobs)
    except (ValueError, KeyError, TypeError, AttributeError, ValidationError) as exc:
        raise _corrupt(key, f"{type(exc).__name__}") from exc
    return _assembled(found, decoded, elements, cache, owner, sizes)


def plain_messages(
    lead: list[bytes],
    elements: list[bytes],
    *,
    starts_only: bool,
    cache: DecodedTurns | None = None,
    owner: str = "",
) -> list[Message] | None:
    """The messages of ``lead`` then ``elements``, validated with compiled
    ``validate_json`` calls (those ``cache`` holds for ``owner`` taken from it, see
    :func:`decode_elements`), read from their header lines alone when none refers to an
    attachment; None if one does, one has no header, (with ``starts_only``) one of
    ``elements`` does not start a turn, or they do not parse (the caller then reads them
    the way that names the key at fault). An element found in ``cache`` was read whole
    before: only its first byte (whether it starts a turn) is looked at again."""
    if starts_only and any(element[:1] != _STARTS for element in elements):
        return None
    everything = [*lead, *elements] if lead else elements
    found: list[Turn | None] = (
        cache.lookup(owner, everything) if cache is not None else [None] * len(everything)
    )
    missing = [i for i, turn in enumerate(found) if turn is None]
    bodies = _plain_bodies([everything[i] for i in missing])
    if bodies is None:
        return None
    try:
        if cache is None:  # every message new, flat (each chunk's lists go as it is read)
            return [m for turn in _turns(bodies, _compacting(None, len(bodies))) for m in turn]
        decoded = dict(zip(missing, _validate_bodies(bodies, shared_message), strict=True))
    except (ValueError, ValidationError):
        return None
    return _assembled(found, decoded, everything, cache, owner)


def _assembled(
    found: list[Turn | None],
    decoded: dict[int, list[Message]],
    elements: list[bytes],
    cache: DecodedTurns | None,
    owner: str,
    blob_sizes: dict[int, int] | None = None,
) -> list[Message]:
    """The messages of every element in order: those ``found`` in the cache, and those
    ``decoded`` now (by index; shared already when there is a cache), kept in the cache."""
    if decoded and cache is not None:
        kept = []
        for i, messages in decoded.items():
            turn = tuple(messages)
            found[i] = turn
            kept.append((elements[i], turn, (blob_sizes or {}).get(i, 0)))
        cache.store_many(owner, kept)
    out: list[Message] = []
    for i, held in enumerate(found):
        out += decoded[i] if held is None else held
    return out


def _plain_bodies(elements: list[bytes]) -> list[memoryview] | None:
    """The JSON bodies (each a JSON array) of elements that have a header line, refer to
    no attachment and whose body is bracketed as an array, else None."""
    bodies: list[memoryview] = []
    for element in elements:
        newline = element.find(b"\n")
        if (
            newline < 1
            or len(element) - newline < 3  # no room for "[]" after the header line
            or element[0] not in _ANY_KIND
            or element.find(_BLOBS_MARK, 1, newline) >= 0
            or element[newline + 1] != _OPEN
            or element[-1] != _CLOSE
        ):
            return None
        bodies.append(memoryview(element)[newline + 1 :])
    return bodies


def _compacting(cache: DecodedTurns | None, count: int) -> Callable[[Message], Message] | None:
    """What each message of a decode of ``count`` elements passes through: shared, for the
    cache; without one, its field sets shared when the decode runs past one chunk (which
    spares the collector; a window's few messages are not worth 1.5 µs each)."""
    if cache is not None:
        return shared_message
    return with_shared_field_sets if count > _CHUNK else None


def _validate_bodies(
    bodies: Sequence[memoryview], compact: Callable[[Message], Message] | None
) -> list[list[Message]]:
    """Each body (a JSON array of messages) decoded: see :func:`_turns`."""
    return list(_turns(bodies, compact))


def _turns(
    bodies: Sequence[memoryview], compact: Callable[[Message], Message] | None
) -> Iterator[list[Message]]:
    """Each body (a JSON array of messages) decoded, a compiled call per ``_CHUNK``
    bodies, each message passed to ``compact`` (it shares what it can in place) before
    the chunk is handed on and the next one decoded. Every body is checked first."""
    for body in bodies:
        if len(body) < 2 or body[0] != _OPEN or body[-1] != _CLOSE:
            raise ValueError("the element body is no JSON array")
    for start in range(0, len(bodies), _CHUNK):
        turns = _ELEMENTS.validate_json(_json_array(bodies[start : start + _CHUNK]))
        if compact is not None:
            for turn in turns:
                for message in turn:
                    compact(message)
        yield from turns


def _json_array(bodies: Sequence[bytes | memoryview]) -> bytes:
    """``[body,body,...]`` (``bodies`` not empty) built in one copy: the brackets join the
    first and the last body, not the whole (each ``b"[" + ... + b"]"`` of a long history
    copied all of it again, which cost several times the join itself)."""
    if len(bodies) == 1:
        return b"[" + bodies[0] + b"]"
    return b",".join([b"[" + bodies[0], *bodies[1:-1], bytes(bodies[-1]) + b"]"])


def _with_blobs(body: memoryview, blobs: dict[str, bytes], blobs_key: str) -> list[Message]:
    out: list[Message] = []
    raw_messages = json.loads(bytes(body))
    if not isinstance(raw_messages, list):
        raise TypeError("the element body is no JSON array")
    for raw in raw_messages:
        for part in raw.get("content", []):
            if "blob" in part:
                part["data"] = _blob(blobs, part.pop("blob"), blobs_key)
        out.append(Message.model_validate(raw))
    return out


def _corrupt(key: str, why: str) -> CorruptDataError:
    return CorruptDataError(
        f"stored turn data in {key} does not parse ({why}); "
        "restore it from a backup or clear the conversation",
        key=key,
    )


def _blob(blobs: dict[str, bytes], sha: str, blobs_key: str) -> bytes:
    data = blobs.get(sha)
    if data is None:
        raise CorruptDataError(
            f"attachment {sha} is missing from {blobs_key}; "
            "restore it from a backup or clear the conversation",
            key=blobs_key,
        )
    return data


def text(value: Any) -> str:
    """A reply item as str (the protocol's client answers bytes): the one bytes->str of
    the store."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def pairs_to_dict(flat: list[Any]) -> dict[str, bytes]:
    """A flat ``[name, value, name, value, ...]`` reply (HGETALL from Lua, blob pairs)."""
    return {text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}

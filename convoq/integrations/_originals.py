"""A framework's own message kept exactly beside convoq's view of it.

An integration stores each framework message as a convoq :class:`~convoq.messages.Message`
that convoq understands (role, text, images and files as attachment parts, tool calls,
tool results), so windows, exports, the CLI and convoq's agents read it. Where that view
alone does not rebuild the framework's message exactly (ids, statuses, annotations, item
types convoq has no counterpart for), the original JSON is kept in
``Message.framework[name]``, which no model wire sends. Attachment bytes found inside the
original are stored once, as the view's image/file parts; the record holds only where they
go back (a JSON path, the index of the part and how the bytes were spelled there: a
``data:`` URL or bare base64).

Record versions (``version``):

* 1 - ``{"version", "original", "binaries": [[path, part, spelling]]}``. Earlier convoq kept
  this record, plus a ``framework`` key, as the message's last file part (of type
  ``application/vnd.convoq.original+json``); such messages load with the part moved here
  (see :data:`convoq.messages.LEGACY_RECORD_MIME_TYPE`).
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from convoq.errors import CorruptDataError, InvalidMessageError
from convoq.messages import UNREADABLE_RECORD, FilePart, ImagePart, Message, Part

RECORD_VERSION = 1
_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+);base64,(.*)", re.DOTALL)

Spelling = Literal["data_url", "base64"]
JsonPath = tuple[str | int, ...]


@dataclass(frozen=True)
class Binary:
    """Bytes found in an original: at ``path`` it read as ``spelling`` of ``content[part]``."""

    path: JsonPath
    part: int
    spelling: Spelling


def data_url(mime_type: str, data: bytes) -> str:
    return f"data:{mime_type};base64,{base64.b64encode(data).decode('ascii')}"


def parse_data_url(value: object) -> tuple[str, bytes] | None:
    """(MIME type, bytes) of a base64 ``data:`` URL spelled exactly as :func:`data_url`
    writes it (else None: the value then stays inside the original)."""
    if not isinstance(value, str) or not (found := _DATA_URL.fullmatch(value)):
        return None
    try:
        data = base64.b64decode(found[2], validate=True)
    except (binascii.Error, ValueError):
        return None
    return (found[1], data) if data and data_url(found[1], data) == value else None


def parse_base64(value: object) -> bytes | None:
    """The bytes of standard base64 that re-encodes to exactly ``value``, else None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return data if base64.b64encode(data).decode("ascii") == value else None


def checked_json(value: Any, what: str) -> Any:
    """``value`` if it is JSON that reads back equal to itself, else InvalidMessageError."""
    try:
        again = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(f"{what} must be JSON data ({exc})", rule="json") from None
    if again != value:
        raise InvalidMessageError(
            f"{what} must be JSON data that reads back as itself (str keys, lists, not tuples)",
            rule="json",
        )
    return value


def with_original(
    view: Message, original: Any, *, framework: str, binaries: list[Binary]
) -> Message:
    """``view`` with ``original`` kept in ``framework[framework]`` (minus the bytes of
    ``binaries``, which the view's parts hold)."""
    blanked = copy.deepcopy(original)
    for binary in binaries:
        _set(blanked, binary.path, None)
    record = {
        "version": RECORD_VERSION,
        "original": blanked,
        "binaries": [[list(b.path), b.part, b.spelling] for b in binaries],
    }
    return view.model_copy(update={"framework": {**(view.framework or {}), framework: record}})


def original_of(message: Message, *, framework: str) -> Any | None:
    """The original kept with ``message`` by ``framework``'s integration, else None.

    Raises:
        CorruptDataError: the kept record does not parse or has a version this convoq
            does not read.
    """
    kept = message.framework or {}
    if UNREADABLE_RECORD in kept:
        raise CorruptDataError(
            "a stored message keeps a framework record that is not JSON; restore the"
            " conversation from a backup or clear it"
        )
    record = kept.get(framework)
    if record is None:
        return None
    try:
        if record["version"] != RECORD_VERSION:
            raise CorruptDataError(
                f"a stored original has record version {record['version']!r}; this convoq"
                f" reads version {RECORD_VERSION}: upgrade convoq"
            )
        original = copy.deepcopy(record["original"])  # the stored message stays as it is
        for path, part, spelling in record["binaries"]:
            _set(original, tuple(path), _spelled(message.content[part], spelling))
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise CorruptDataError(f"a stored original does not parse ({exc!r})") from None
    return original


def _spelled(part: Part, spelling: str) -> str:
    if not isinstance(part, ImagePart | FilePart):
        raise TypeError(f"part {part.type} holds no bytes")
    if spelling == "data_url":
        return data_url(part.mime_type, part.data)
    return base64.b64encode(part.data).decode("ascii")


def _set(node: Any, path: JsonPath, value: Any) -> None:
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value

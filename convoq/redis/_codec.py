"""Turn elements and blobs: how messages are laid out in Redis (format_version 1).

A stored element is the JSON object ``{"blobs": [sha256...], "messages": [...]}``. Each
attachment part keeps its fields but its bytes are replaced by ``"blob": sha256hex``; the
bytes live once per conversation in the ``blobs`` hash. The Lua side reads ``blobs`` (to
fetch them in the same round trip) and the role of the first message (a user message
starts a turn; any other element continues the turn before it).

Format changelog (the ``format_version`` field of the meta hash):
  1: this layout (turn elements + lead list + blobs hash).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from convoq.errors import CorruptDataError
from convoq.limits import Limits, attachment_too_large, turn_too_large
from convoq.messages import Message, TextPart

FORMAT_VERSION = 1


@dataclass
class Encoded:
    """Elements ready for a script: JSON strings plus the blobs they refer to."""

    elements: list[bytes] = field(default_factory=list)
    blobs: dict[str, bytes] = field(default_factory=dict)

    def blob_args(self) -> list[bytes | str]:
        """sha, bytes, sha, bytes, ...: the tail of a script's ARGV."""
        args: list[bytes | str] = []
        for sha, data in self.blobs.items():
            args += [sha, data]
        return args


def encode_element(messages: list[Message], limits: Limits, into: Encoded) -> bytes:
    """Encode one element, add its blobs to ``into`` and return the JSON."""
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
    element = json.dumps(
        {"blobs": refs, "messages": out}, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")
    into.elements.append(element)
    return element


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


def decode_elements(
    elements: list[bytes], blobs: dict[str, bytes], *, key: str, blobs_key: str
) -> list[Message]:
    """Messages of stored elements, attachment bytes restored from ``blobs``."""
    messages: list[Message] = []
    for element in elements:
        try:
            data = json.loads(element)
            raw_messages = data["messages"]
            for raw in raw_messages:
                for part in raw.get("content", []):
                    if "blob" in part:
                        part["data"] = _blob(blobs, part.pop("blob"), blobs_key)
                messages.append(Message.model_validate(raw))
        except (ValueError, KeyError, TypeError, AttributeError, ValidationError) as exc:
            raise CorruptDataError(
                f"stored turn data in {key} does not parse ({type(exc).__name__}); "
                "restore it from a backup or clear the conversation",
                key=key,
            ) from exc
    return messages


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

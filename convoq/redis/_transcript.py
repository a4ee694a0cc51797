"""A conversation's stored history as the operators' console (:mod:`convoq.gateway`) pages
it: newest first, a page of stored elements at a time, attachments by reference.

An element is read as stored (:mod:`convoq.redis._codec`): its header says whether it
starts a turn and which blobs it refers to, its body is the JSON of its messages with each
attachment's bytes replaced by ``"blob": sha256``. The page keeps that form (no bytes, no
base64: a page of a conversation full of images stays small) and adds each attachment's
size; the bytes come one attachment at a time from :meth:`Transcript.attachment`. A page
reads only what it shows, whatever the history's length: ``LRANGE`` of its elements (with
the list's length and the lead), then one ``HSTRLEN`` per attachment on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from convoq.errors import CorruptDataError
from convoq.redis._cluster import AsyncRedis
from convoq.redis._codec import Header, parse_header
from convoq.redis.keys import KeySchema

# What the console shows of a stored message (``framework`` records are another
# framework's business, and no model wire sends them either).
_SHOWN = ("role", "tool_calls", "tool_call_id", "name", "refusal", "usage", "finish_reason",
          "decision")  # fmt: skip


@dataclass(frozen=True)
class StoredTurn:
    """The messages of one stored turn; ``index``: its first element's place in the list."""

    index: int
    messages: list[dict[str, Any]]


@dataclass(frozen=True)
class TranscriptPage:
    """Stored turns newest first; ``next_before`` pages on (None: this page reached the
    start); ``lead``: the leading system/developer messages, on the page that reaches the
    start only; ``total``: elements stored."""

    total: int
    turns: list[StoredTurn]
    next_before: int | None
    lead: list[dict[str, Any]] = field(default_factory=list)


class Transcript:
    """Pages of one deployment's stored histories (see the module docstring)."""

    def __init__(self, redis: AsyncRedis, keys: KeySchema) -> None:
        self.redis = redis
        self.keys = keys

    async def page(self, cid: str, *, before: int | None, limit: int) -> TranscriptPage:
        """Up to ``limit`` elements before element index ``before`` (None: the newest),
        as whole turns where the page holds their start."""
        turns_key = self.keys.turns(cid)
        if before is not None and before < 1:
            raise ValueError("before must be 1 or more: there is nothing before element 0")
        start, stop = (-limit, -1) if before is None else (max(0, before - limit), before - 1)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.llen(turns_key)
            pipe.lrange(turns_key, start, stop)
            pipe.lrange(self.keys.lead(cid), 0, -1)
            total, elements, lead = await pipe.execute()
        total = int(total)
        if before is not None and before > total:
            # Asked past the end (the history was pruned or cleared since): the newest page.
            return await self.page(cid, before=None, limit=limit)
        first = total - len(elements) if before is None else max(0, before - limit)
        headers = [parse_header(e, key=turns_key) for e in elements]
        skip = _continued(headers) if first > 0 else 0
        headers, first = headers[skip:], first + skip
        lead_headers = (
            [parse_header(e, key=self.keys.lead(cid)) for e in lead] if first == 0 else []
        )
        sizes = await self._sizes(cid, [*lead_headers, *headers])
        turns: list[StoredTurn] = []
        for offset, header in enumerate(headers):
            messages = _messages(header, sizes, turns_key)
            if header.starts_turn or not turns:
                turns.append(StoredTurn(first + offset, messages))
            else:
                turns[-1].messages.extend(messages)
        lead_messages = [m for h in lead_headers for m in _messages(h, sizes, turns_key)]
        turns.reverse()
        return TranscriptPage(total, turns, first if first > 0 else None, lead_messages)

    async def attachment(self, cid: str, sha256: str) -> bytes | None:
        """The bytes of one of the conversation's stored attachments (None: no such one)."""
        data = await self.redis.hget(self.keys.blobs(cid), sha256)
        if data is None:
            return None
        return data if isinstance(data, bytes) else str(data).encode()

    async def _sizes(self, cid: str, headers: list[Header]) -> dict[str, int]:
        refs = list(dict.fromkeys(sha for h in headers for sha in h.blobs))
        if not refs:
            return {}
        async with self.redis.pipeline(transaction=False) as pipe:
            for sha in refs:
                pipe.hstrlen(self.keys.blobs(cid), sha)
            lengths = await pipe.execute()
        return dict(zip(refs, (int(n) for n in lengths), strict=True))


def _continued(headers: list[Header]) -> int:
    """How many elements at the page's start continue a turn that starts before the page
    (they go with that turn, on the next page), unless no turn starts on this page."""
    for index, header in enumerate(headers):
        if header.starts_turn:
            return index
    return 0


def _messages(header: Header, sizes: dict[str, int], key: str) -> list[dict[str, Any]]:
    """The element's messages as the console shows them; CorruptDataError naming ``key``
    when its body does not parse."""
    try:
        raw = json.loads(bytes(header.body))
        if not isinstance(raw, list):
            raise ValueError("not a JSON array")
        return [_message(m, sizes) for m in raw]
    except (ValueError, TypeError, AttributeError) as exc:
        raise CorruptDataError(
            f"a stored element of {key} does not parse ({exc})"[:300]
            + "; prune or clear the conversation",
            key=key,
        ) from exc


def _message(raw: dict[str, Any], sizes: dict[str, int]) -> dict[str, Any]:
    shown = {name: raw[name] for name in _SHOWN if raw.get(name) is not None}
    shown.setdefault("role", "user")
    parts: list[dict[str, Any]] = []
    for part in raw.get("content") or []:
        kind = part.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind in ("image", "file"):
            sha = part.get("blob")
            parts.append({
                "type": kind,
                "mime_type": str(part.get("mime_type", "")),
                "filename": part.get("filename"),
                "sha256": sha if isinstance(sha, str) else None,
                "size": sizes.get(sha) if isinstance(sha, str) else None,
            })  # fmt: skip
    shown["content"] = parts
    return shown

"""What the operators' console (:mod:`convoq.gateway`) shows of a conversation and its
turns: the conversation as its keys hold it (:class:`Overview`), turns in brief from
their records (:class:`TurnBrief`), and one turn whole (its record, every event of its
stream and the state a run left: the journal of a running turn, the continuation of a
parked one). Plain reads, pipelined; nothing here writes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from convoq.redis._cluster import AsyncRedis
from convoq.redis._codec import text
from convoq.redis._events import read_entries
from convoq.redis._records import TurnRecord, decode_record
from convoq.redis.keys import KeySchema
from convoq.turn_state import TurnEvent, TurnState
from convoq.usage import COUNTER_FIELDS, Usage, counters_by_model, counters_to_usage

INBOX_SHOWN = 100
"""Queued turn ids an overview lists (the inbox's length is always given)."""

_BRIEF = ("status", "agent", "created_ms", "started_ms", "finished_ms", "attempts", "retries")


@dataclass(frozen=True)
class Lease:
    """Who holds a conversation: ``state`` "active" (a turn runs) or "parked" (one awaits
    approval), the holder's worker id, and when the lease lapses (unix ms)."""

    state: str
    holder: str | None
    expires_ms: int | None


@dataclass(frozen=True)
class Glance:
    """A conversation at a glance: turns stored, turns in its inbox, its lease."""

    stored_turns: int
    inbox_length: int
    lease: Lease | None

    @property
    def running(self) -> bool:
        """Its inbox's head runs (an active lease; an in-process turn has no inbox)."""
        return self.inbox_length > 0 and self.lease is not None and self.lease.state == "active"

    @property
    def parked(self) -> bool:
        """Its inbox's head awaits approval."""
        return self.inbox_length > 0 and self.lease is not None and self.lease.state == "parked"


@dataclass(frozen=True)
class Overview:
    """A conversation as its keys hold it now."""

    conversation_id: str
    stored_turns: int
    stored_bytes: int
    stored_elements: int
    usage: Usage
    usage_by_model: dict[str, Usage]
    summary: str | None
    summary_watermark: int | None
    inbox: list[str]
    inbox_length: int
    lease: Lease | None
    format_version: str | None = None


@dataclass(frozen=True)
class TurnBrief:
    """A turn as its record says in brief (no input, no result): enough for a list."""

    conversation_id: str
    turn_id: str
    status: str
    agent: str
    created_ms: int | None
    started_ms: int | None
    finished_ms: int | None
    attempts: int
    retries: int
    error: dict[str, Any] | None = None


@dataclass(frozen=True)
class TurnWhole:
    """One turn: its record, the events of its stream in order (id, event), and the
    messages its runs got to (the journal or continuation; None when it has neither)."""

    record: TurnRecord
    events: list[tuple[str, TurnEvent]]
    state: TurnState | None
    lease: Lease | None
    inbox_head: str | None = None


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and value != b"" else None
    except (TypeError, ValueError):
        return None


def _lease(raw: dict[bytes, bytes]) -> Lease | None:
    if not raw or b"state" not in raw:
        return None
    holder = raw.get(b"holder")
    return Lease(
        text(raw[b"state"]), text(holder) if holder else None, _int(raw.get(b"expires_ms"))
    )


class Inspect:
    """Reads of one deployment's conversations and turns (see the module docstring)."""

    def __init__(self, redis: AsyncRedis, keys: KeySchema) -> None:
        self.redis = redis
        self.keys = keys

    async def overview(self, cid: str) -> Overview:
        """The conversation now: stored turns, usage, summary, inbox and lease."""
        keys = self.keys
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.meta(cid))
            pipe.hmget(keys.summary(cid), "text", "watermark")
            pipe.llen(keys.inbox(cid))
            pipe.lrange(keys.inbox(cid), 0, INBOX_SHOWN - 1)
            pipe.hgetall(keys.lease(cid))
            pipe.llen(keys.turns(cid))
            meta, (summary, watermark), length, inbox, lease, elements = await pipe.execute()
        counters = {text(k): v for k, v in meta.items() if text(k) in COUNTER_FIELDS.values()}
        version = meta.get(b"format_version")
        return Overview(
            conversation_id=cid,
            stored_turns=_int(meta.get(b"turns")) or 0,
            stored_bytes=_int(meta.get(b"bytes")) or 0,
            stored_elements=int(elements),
            usage=counters_to_usage(counters),
            usage_by_model=counters_by_model(meta),
            summary=text(summary) if summary is not None else None,
            summary_watermark=_int(watermark),
            inbox=[text(t) for t in inbox],
            inbox_length=int(length),
            lease=_lease(lease),
            format_version=text(version) if version is not None else None,
        )

    async def briefs(self, refs: Sequence[tuple[str, str]]) -> list[TurnBrief]:
        """The turns ``refs`` (conversation id, turn id) in brief, in that order; those
        whose record is gone (expired) are left out."""
        if not refs:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for cid, tid in refs:
                pipe.hmget(self.keys.turn(cid, tid), [*_BRIEF, "error"])
            replies = await pipe.execute()
        found: list[TurnBrief] = []
        for (cid, tid), values in zip(refs, replies, strict=True):
            if values[0] is not None:
                found.append(_brief(cid, tid, values))
        return found

    async def glances(self, cids: Sequence[str]) -> list[Glance]:
        """For each conversation: its stored turns, its inbox's length and its lease."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for cid in cids:
                pipe.hget(self.keys.meta(cid), "turns")
                pipe.llen(self.keys.inbox(cid))
                pipe.hgetall(self.keys.lease(cid))
            replies = await pipe.execute()
        return [
            Glance(_int(replies[i]) or 0, int(replies[i + 1]), _lease(replies[i + 2]))
            for i in range(0, len(replies), 3)
        ]

    async def whole(self, cid: str, tid: str) -> TurnWhole | None:
        """The turn whole (see :class:`TurnWhole`), or None when it has no record."""
        keys = self.keys
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(keys.turn(cid, tid))
            pipe.xrange(keys.events(cid, tid))
            pipe.get(keys.journal(cid, tid))
            pipe.get(keys.cont(cid, tid))
            pipe.hgetall(keys.lease(cid))
            pipe.lindex(keys.inbox(cid), 0)
            raw, entries, journal, cont, lease, head = await pipe.execute()
        if not raw:
            return None
        fields = {text(k): v for k, v in raw.items()}
        record = decode_record(cid, tid, fields, keys.turn(cid, tid))
        events, _ = read_entries([(keys.events(cid, tid), entries)])
        return TurnWhole(
            record=record,
            events=events,
            state=_state(journal if journal is not None else cont),
            lease=_lease(lease),
            inbox_head=text(head) if head is not None else None,
        )


def _brief(cid: str, tid: str, values: list[Any]) -> TurnBrief:
    status, agent, created, started, finished, attempts, retries, error = values
    return TurnBrief(
        conversation_id=cid,
        turn_id=tid,
        status=text(status),
        agent=text(agent) if agent is not None else "",
        created_ms=_int(created),
        started_ms=_int(started),
        finished_ms=_int(finished),
        attempts=_int(attempts) or 0,
        retries=_int(retries) or 0,
        error=_error(error),
    )


def _error(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return {"type": "CorruptDataError", "message": "the stored error does not parse"}
    return value if isinstance(value, dict) else None


def _state(raw: bytes | None) -> TurnState | None:
    """The saved state, or None when there is none or it does not parse (the console shows
    what the events say instead: a reader must not fail on a run's scratch state)."""
    if raw is None:
        return None
    try:
        return TurnState.model_validate_json(raw)
    except ValidationError:
        return None

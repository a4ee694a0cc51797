"""Finding conversations and turns for the operators' console (:mod:`convoq.gateway`),
which reads through :class:`Browse`.

Redis keeps no index of conversations, nor of a conversation's turns: what a turn needs
(its inbox, lease, record, events) is found by key, and an index would cost every submit
a write in another Cluster slot. So the console finds them as ``clear`` and the approvals
inbox do, with ``SCAN`` under a pattern: the deployment's prefix and the encoded start of
the conversation ids asked for (:func:`convoq.ids.key_part` encodes character by
character, so the encoded prefix of an id is the prefix of its encoded form; no glob
character survives the encoding). A SCAN walks the whole keyspace whatever its pattern,
so each is bounded (:class:`ScanBound`): past its bound the answer says it saw only part
of the keyspace (``complete`` False) instead of walking on.

Turn ids convoq makes start with their creation time (:func:`convoq.ids.new_turn_id`),
so the newest turn of a conversation is its greatest id and turns page newest first by
id, without reading a record to sort them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from convoq.ids import from_key_part, key_part
from convoq.redis._cluster import AsyncRedis
from convoq.redis._codec import text
from convoq.redis.keys import KeySchema

SCAN_COUNT = 1000
"""Keys Redis looks at per SCAN call (its ``COUNT`` hint)."""


@dataclass(frozen=True)
class ScanBound:
    """How far one look-up may SCAN: at most ``max_keys`` matching keys, for at most
    ``max_s`` seconds; past either it stops and reports what it saw as incomplete."""

    max_keys: int = 200_000
    max_s: float = 2.0


@dataclass
class Seen:
    """What one SCAN found of a conversation: its turn records' ids and which of its
    other keys exist."""

    turn_ids: set[str] = field(default_factory=set)
    kinds: set[str] = field(default_factory=set)


@dataclass
class Scan:
    """Conversations (by id) a SCAN found; ``complete``: it walked the whole keyspace."""

    found: dict[str, Seen] = field(default_factory=dict)
    complete: bool = True


@dataclass
class Backlog:
    """Turns in inboxes: per partition, those ``queued`` (waiting for a worker), ``running``
    and ``parked`` (awaiting approval); ``holders``: running turns per lease holder (the
    worker id a worker takes leases as)."""

    queued: dict[int, int] = field(default_factory=dict)
    running: dict[int, int] = field(default_factory=dict)
    parked: dict[int, int] = field(default_factory=dict)
    holders: dict[str, int] = field(default_factory=dict)
    complete: bool = True


def created_ms_of(turn_id: str) -> int | None:
    """When a turn convoq made was created (unix ms, from its id); None for another id."""
    head = turn_id[:12]
    if len(turn_id) != 28 or any(c not in "0123456789abcdef" for c in head):
        return None
    return int(head, 16)


class Browse:
    """The console's look-ups on one deployment's keys (see the module docstring)."""

    def __init__(self, redis: AsyncRedis, keys: KeySchema, bound: ScanBound | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.bound = bound or ScanBound()

    def _head(self) -> str:
        return f"{self.keys.prefix}:{{"

    def _pattern(self, id_prefix: str, tail: str = "") -> str:
        """Keys of the conversations whose id starts with ``id_prefix``, ending in ``tail``."""
        encoded = key_part(id_prefix) if id_prefix else ""
        return f"{self._head()}{encoded}*{tail}"

    async def _scan(self, pattern: str) -> AsyncIterator[tuple[str, str] | None]:
        """(encoded id, rest of the key) of each key matching ``pattern``; a last None
        when the bound stopped the walk."""
        deadline = time.monotonic() + self.bound.max_s
        head, seen = self._head(), 0
        iterator = cast(
            AsyncGenerator[Any, None], self.redis.scan_iter(match=pattern, count=SCAN_COUNT)
        )
        async with contextlib.aclosing(iterator) as keys:
            async for raw in keys:
                seen += 1
                if seen > self.bound.max_keys or time.monotonic() > deadline:
                    yield None
                    return
                name = text(raw)
                part, found, rest = name[len(head) :].partition("}:")
                if found and name.startswith(head):
                    yield part, rest

    async def conversations(self, id_prefix: str = "") -> Scan:
        """Every conversation whose id starts with ``id_prefix``, with what is kept of it."""
        scan, ids = Scan(), _Ids()
        async for item in self._scan(self._pattern(id_prefix)):
            if item is None:
                scan.complete = False
                break
            cid = ids.of(item[0])
            if cid is None:
                continue  # a deployment-wide key ({~queued}) or not an id convoq encoded
            seen = scan.found.setdefault(cid, Seen())
            kind, _, tid = item[1].partition(":")
            if kind == "turn" and tid:
                seen.turn_ids.add(tid)
            else:
                seen.kinds.add(kind)
        return scan

    async def turn_ids(self, cid: str) -> tuple[list[str], bool]:
        """The ids of ``cid``'s turn records, newest first, and whether the SCAN was whole."""
        pattern = f"{self.keys.base(cid)}:turn:*"
        found: set[str] = set()
        complete = True
        async for item in self._scan(pattern):
            if item is None:
                complete = False
                break
            found.add(item[1].partition(":")[2])
        found.discard("")
        return sorted(found, reverse=True), complete

    async def backlog(self, partition: Callable[[str], int], id_prefix: str = "") -> Backlog:
        """The turns in the inboxes of the conversations starting with ``id_prefix``, by
        ``partition`` (of a conversation id)."""
        backlog, ids = Backlog(), _Ids()
        batch: list[str] = []
        async for item in self._scan(self._pattern(id_prefix, "}:inbox")):
            if item is None:
                backlog.complete = False
                break
            cid = ids.of(item[0])
            if cid is not None and item[1] == "inbox":
                batch.append(cid)
            if len(batch) >= 500:
                await self._count(batch, partition, backlog)
        await self._count(batch, partition, backlog)
        return backlog

    async def _count(
        self, batch: list[str], partition: Callable[[str], int], backlog: Backlog
    ) -> None:
        if not batch:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for cid in batch:
                pipe.llen(self.keys.inbox(cid))
                pipe.hmget(self.keys.lease(cid), "state", "holder")
            replies = await pipe.execute()
        for index, cid in enumerate(batch):
            length, (state, holder) = int(replies[2 * index]), replies[2 * index + 1]
            part = partition(cid)
            busy = length > 0 and state in (b"active", b"parked")
            if busy and state == b"active":
                backlog.running[part] = backlog.running.get(part, 0) + 1
                who = text(holder) if holder is not None else ""
                backlog.holders[who] = backlog.holders.get(who, 0) + 1
            elif busy:
                backlog.parked[part] = backlog.parked.get(part, 0) + 1
            backlog.queued[part] = backlog.queued.get(part, 0) + length - (1 if busy else 0)
        batch.clear()


class _Ids:
    """Encoded ids decoded once per SCAN (a conversation has many keys)."""

    def __init__(self) -> None:
        self._known: dict[str, str | None] = {}

    def of(self, part: str) -> str | None:
        if part not in self._known:
            self._known[part] = from_key_part(part)
        return self._known[part]

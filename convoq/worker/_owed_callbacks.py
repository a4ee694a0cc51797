"""Callbacks the workers owe, kept in Redis until delivered or given up.

A turn's callback goes out as a ``convoq.deliver_callback`` task, and a retry waits in the
worker that scheduled it (Celery's countdown). Neither survives that worker's death by
itself: with the fast paths on the broker keeps no unacked note of a task a worker holds
(:func:`convoq.worker.app.worker_config`). So the worker notes each owed callback in one
sorted set, scored by when it is due again (now, or the retry's time, plus
``redeliver_after_s`` for the task in flight); the delivery's end (delivered, refused,
given up) removes it, and the sweeper sends the task again for any entry past its score.
Callbacks are delivered at least once: a receiver that must not act twice dedupes by the
turn id the payload carries.
"""

from __future__ import annotations

import json
import time

from convoq.redis._cluster import AsyncRedis
from convoq.redis.keys import KeySchema

BATCH = 100
"""Owed callbacks the sweeper sends again per pass at most (the rest in later passes)."""


class OwedCallbacks:
    """The owed callbacks of one prefix (``{prefix}:callbacks:owed``)."""

    def __init__(self, redis: AsyncRedis, keys: KeySchema, redeliver_after_s: float) -> None:
        self._redis = redis
        self._key = keys.owed_callbacks()
        self._grace_ms = int(redeliver_after_s * 1000)

    async def owe(self, cid: str, tid: str, *, in_s: float = 0.0) -> None:
        """Note (or move) the callback of ``tid``: due ``in_s`` from now, plus the grace of
        a task in flight."""
        due = _now_ms() + int(in_s * 1000) + self._grace_ms
        await self._redis.zadd(self._key, {_member(cid, tid): due})

    async def settle(self, cid: str, tid: str) -> None:
        """The callback of ``tid`` ended (delivered, refused or given up)."""
        await self._redis.zrem(self._key, _member(cid, tid))

    async def overdue(self) -> list[tuple[str, str]]:
        """Callbacks past their score, each moved one grace ahead (the task about to be
        sent again is in flight from now): (conversation id, turn id) pairs."""
        now = _now_ms()
        replied = await self._redis.zrangebyscore(self._key, "-inf", now, start=0, num=BATCH)
        found = [member for member in replied if isinstance(member, bytes)]
        if not found:
            return []
        moved: dict[bytes, int] = dict.fromkeys(found, now + self._grace_ms)
        await self._redis.zadd(self._key, moved, xx=True)
        pairs = []
        for member in found:
            cid, tid = json.loads(member)
            pairs.append((str(cid), str(tid)))
        return pairs


def _member(cid: str, tid: str) -> str:
    return json.dumps([cid, tid], separators=(",", ":"))


def _now_ms() -> int:
    return int(time.time() * 1000)

"""Callbacks the workers owe, kept in Redis until delivered or given up.

A turn's callback goes out as a ``convoq.deliver_callback`` task, and a retry waits in the
worker that scheduled it (Celery's countdown). Neither survives that worker's death by
itself: with the fast paths on the broker keeps no unacked note of a task a worker holds
(:func:`convoq.worker.app.worker_config`). So the worker notes each owed callback in one
sorted set, scored by when it is due again (now, or the retry's time, plus
``redeliver_after_s`` for the task in flight); the delivery's end (delivered, refused,
given up) removes it, and the sweeper sends the task again for any entry past its score.
Callbacks are delivered at least once: a receiver that must not act twice dedupes by the
turn id the payload carries. :class:`Callbacks` is a worker's side of all this.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

from convoq.netguard import CallbackPolicy
from convoq.queue import routing
from convoq.redis._cluster import AsyncRedis
from convoq.redis.keys import KeySchema
from convoq.settings import ConvoqSettings
from convoq.worker import webhooks

if TYPE_CHECKING:
    from convoq.worker._event_loop import WorkerLoop
    from convoq.worker._kicks import Kicks

log = logging.getLogger("convoq.worker")

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


class Callbacks:
    """A worker's callbacks: each noted as owed before its delivery task is sent, delivered
    from its turn's record, settled or owed again when an attempt ends, sent again once
    overdue (see the module docstring)."""

    def __init__(
        self,
        loop: WorkerLoop,
        kicks: Kicks,
        keys: KeySchema,
        settings: ConvoqSettings,
        policy: CallbackPolicy,
    ) -> None:
        self._loop = loop
        self._kicks = kicks
        self._keys = keys
        self._settings = settings
        self._policy = policy
        self._owed: OwedCallbacks | None = None

    async def owe(self, cid: str, tid: str) -> None:
        """Note the callback of the finished turn ``tid``, then send its delivery task."""
        await self._owed_callbacks().owe(cid, tid)  # before the task: nothing in between
        await self._send(cid, tid)

    async def _send(self, cid: str, tid: str) -> None:
        # On this worker's own pool's queue (CONVOQ_POOL): one that is consumed, where
        # only pools serve the agents and no worker reads the default queues.
        pool = self._settings.pool
        await self._kicks.send_from_loop(routing.DELIVER_CALLBACK_TASK, cid, tid, pool=pool)

    async def deliver(self, cid: str, tid: str) -> webhooks.Attempt:
        """One delivery attempt of ``tid``'s callback (:func:`webhooks.deliver`)."""
        return await webhooks.deliver(
            self._loop.open().protocol,
            cid,
            tid,
            secret=self._settings.webhook_secret,
            timeout_s=self._settings.webhook_timeout_s,
            policy=self._policy,
        )

    async def ended(self, cid: str, tid: str, retry_in_s: float | None = None) -> None:
        """A delivery attempt of ``tid``'s callback ended: settled, or owed again in
        ``retry_in_s`` (the retry's countdown)."""
        owed = self._owed_callbacks()
        if retry_in_s is None:
            await owed.settle(cid, tid)
        else:
            await owed.owe(cid, tid, in_s=retry_in_s)

    async def send_overdue(self) -> None:
        """Send again the callbacks a dead worker held."""
        overdue = await self._owed_callbacks().overdue()
        for cid, tid in overdue:
            await self._send(cid, tid)
        if overdue:
            log.warning("sent %d overdue callback(s) again: %s", len(overdue), overdue[:10])

    def _owed_callbacks(self) -> OwedCallbacks:
        if self._owed is None:
            redis = self._loop.open().redis
            self._owed = OwedCallbacks(redis, self._keys, self._settings.webhook_redeliver_after_s)
        return self._owed


def _member(cid: str, tid: str) -> str:
    return json.dumps([cid, tid], separators=(",", ":"))


def _now_ms() -> int:
    return int(time.time() * 1000)

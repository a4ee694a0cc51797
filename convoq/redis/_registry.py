"""The registry of a deployment on one Redis: the workers running, the agent profiles
and key prefixes they registered, and the dataset's epoch marker (a Redis that came back
empty, or another dataset behind the same URL, is noticed).

Liveness. A worker's entry carries ``seen_ms``, refreshed every heartbeat: its sweep
period (``CONVOQ_SWEEP_INTERVAL_S``, 5 s by default), which it records as
``heartbeat_ms``. A reader judges each entry by that worker's own period: missed
:data:`STALE_HEARTBEATS` heartbeats in a row, it is dead (``alive: false``, 15 s at the
default period); missed :data:`DROP_HEARTBEATS`, its entry is dropped (one minute). A
worker that stops cleanly withdraws its entry at once; one killed (``kill -9``, a lost
machine) is reported dead, then forgotten. A dropped worker that was only stalled comes
back at its next heartbeat.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from convoq import defaults
from convoq.errors import ConversationMemoryError
from convoq.redis._base import ProtocolBase
from convoq.redis._codec import text

STALE_HEARTBEATS = 3
"""Heartbeats a worker may miss before it is reported dead (``alive: false``)."""
DROP_HEARTBEATS = 12
"""Heartbeats a worker may miss before its entry is dropped from the registry."""


def judged(info: dict[str, Any], now_ms: int, heartbeat_ms: int) -> dict[str, Any] | None:
    """``info`` (a worker's entry) with ``alive`` and ``last_seen`` (ISO 8601, UTC) and
    ``last_seen_s`` (seconds ago) added; None when it is past the drop bound.
    ``heartbeat_ms``: the period assumed when the entry records none."""
    period = info.get("heartbeat_ms")
    period = period if isinstance(period, int) and period > 0 else heartbeat_ms
    seen = info.get("seen_ms")
    if not isinstance(seen, int):
        return {**info, "alive": False, "last_seen": None, "last_seen_s": None}
    ago = max(0, now_ms - seen)
    if ago > DROP_HEARTBEATS * period:
        return None
    stamp = datetime.fromtimestamp(seen / 1000, UTC).isoformat(timespec="milliseconds")
    return {
        **info,
        "alive": ago <= STALE_HEARTBEATS * period,
        "last_seen": stamp,
        "last_seen_s": round(ago / 1000, 1),
    }


class RegistryMixin(ProtocolBase):
    """``registered_agents``, ``registered_workers``, ``registered_prefixes``,
    ``check_epoch``."""

    async def registered_agents(self) -> frozenset[str]:
        """The agent profile names running workers registered."""
        return frozenset(text(n) for n in await self.redis.smembers(self.keys.agents()))

    async def registered_workers(
        self, *, heartbeat_s: float = defaults.SWEEP_INTERVAL_S
    ) -> dict[str, dict[str, Any]]:
        """Workers as they registered: name -> pid, queues, agents, started_ms, seen_ms,
        heartbeat_ms, and as judged now (see the module docstring): ``alive``,
        ``last_seen`` (ISO 8601, UTC) and ``last_seen_s`` (seconds ago). Entries past the
        drop bound are left out and removed. ``heartbeat_s``: the period of an entry that
        records none (a worker of an older convoq)."""
        key = self.keys.workers()
        entries = await self.redis.hgetall(key)
        now_ms, period_ms = int(time.time() * 1000), int(heartbeat_s * 1000)
        workers: dict[str, dict[str, Any]] = {}
        gone: list[str] = []
        for raw_name, raw in entries.items():
            name, info = text(raw_name), json.loads(raw)
            seen = judged(info, now_ms, period_ms) if isinstance(info, dict) else None
            if seen is None:
                gone.append(name)
            else:
                workers[name] = seen
        if gone:
            await self.redis.hdel(key, *gone)
        return workers

    async def registered_prefixes(self) -> frozenset[str]:
        """The prefixes any worker on this Redis has registered under."""
        return frozenset(text(n) for n in await self.redis.smembers(self.keys.prefixes()))

    async def check_epoch(self, expected: str | None) -> str:
        """The dataset's epoch marker, created if absent. Workers call it with None at start
        and then with the value they got: a different value means Redis came back empty
        or another dataset is behind the URL, and ConversationMemoryError is raised."""
        key = self.keys.epoch()
        await self.redis.set(key, uuid.uuid4().hex, nx=True)
        current = text(await self.redis.get(key) or b"")
        if expected is not None and current != expected:
            raise ConversationMemoryError(
                f"the Redis dataset changed (epoch {expected} is now {current}): it was emptied"
                " or replaced; check Redis persistence (AOF) before serving again",
                expected=expected,
                found=current,
            )
        return current

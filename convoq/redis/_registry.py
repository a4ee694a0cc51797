"""The registry of a deployment on one Redis: the workers running, the agent profiles
and key prefixes they registered, and the dataset's epoch marker (a Redis that came back
empty, or another dataset behind the same URL, is noticed)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from convoq.errors import ConversationMemoryError
from convoq.redis._base import ProtocolBase
from convoq.redis._codec import text


class RegistryMixin(ProtocolBase):
    """``registered_agents``, ``registered_workers``, ``registered_prefixes``,
    ``check_epoch``."""

    async def registered_agents(self) -> frozenset[str]:
        """The agent profile names running workers registered."""
        return frozenset(text(n) for n in await self.redis.smembers(self.keys.agents()))

    async def registered_workers(self) -> dict[str, dict[str, Any]]:
        """Running workers as they registered: name -> pid, queues, agents, started_ms,
        seen_ms (refreshed every sweep period, so a stale entry is a dead worker)."""
        entries = await self.redis.hgetall(self.keys.workers())
        return {text(name): json.loads(info) for name, info in entries.items()}

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

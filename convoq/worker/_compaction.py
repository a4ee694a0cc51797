"""Compaction on workers: after a turn the runner asks for it (:meth:`Compactor.queue`, a
``convoq.compact`` task, never run beside a turn of the conversation), and the task
summarises the conversation's oldest turns when the profile's policy says so
(:func:`convoq.compaction.compact_idle`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from convoq.compaction import compact_idle
from convoq.memory.redis import RedisConversationMemory
from convoq.queue import routing
from convoq.redis import KeySchema
from convoq.settings import ConvoqSettings
from convoq.summary import Summary
from convoq.worker._event_loop import WorkerLoop
from convoq.worker._kicks import Kicks
from convoq.worker.profiles import Profiles


class Compactor:
    """The compaction of idle conversations on this worker (see the module docstring)."""

    def __init__(
        self,
        loop: WorkerLoop,
        kicks: Kicks,
        profiles: Profiles,
        settings: ConvoqSettings,
        keys: KeySchema,
        kick: Callable[[str], Awaitable[None]],
    ) -> None:
        self._loop = loop
        self._kicks = kicks
        self._kick = kick
        self._profiles = profiles
        self._settings = settings
        self._keys = keys
        self._memory: RedisConversationMemory | None = None

    async def compact(self, cid: str, agent: str) -> Summary | None:
        """Summarise the conversation if ``agent``'s compaction policy says so."""
        policy = self._profiles.get_profile(agent).compaction
        if policy is None:
            return None
        summary = await compact_idle(self._memory_on_loop(), cid, policy)
        # A turn submitted meanwhile found the conversation held and was not run: kick it
        # now (on the queue of the pool serving its agent) rather than leave it to the
        # sweeper.
        if await self._loop.open().protocol.redis.llen(self._keys.inbox(cid)):
            await self._kick(cid)
        return summary

    async def queue(self, cid: str, agent: str) -> None:
        """Send the conversation a ``convoq.compact`` task for ``agent`` (the runner's
        compaction hook)."""
        # On the queues of the pool serving the profile: its policy is there.
        pool = self._kicks.pool_of(agent)
        await self._kicks.send_from_loop(routing.COMPACT_TASK, cid, agent, pool=pool)

    def _memory_on_loop(self) -> RedisConversationMemory:
        if self._memory is None:
            s = self._settings
            self._memory = RedisConversationMemory(
                client=self._loop.open().redis,
                prefix=s.prefix,
                max_attachment_bytes=s.max_attachment_bytes,
                max_turn_bytes=s.max_turn_bytes,
                conversation_ttl_s=s.conversation_ttl_s,
            )
        return self._memory

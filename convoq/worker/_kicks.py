"""Kicks: the tasks a worker sends to a conversation's queue (a drain, a callback's
delivery, a compaction), the hints a drain kick carries in its headers, and the kicks
waiting in the queues this worker consumes (what :mod:`._fair` counts through the broker).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from celery import Celery, current_task
from kombu.exceptions import ChannelError

from convoq.queue import routing
from convoq.queue.transport import FENCE_HEADER, HEAD_HEADER
from convoq.settings import ConvoqSettings


class Kicks:
    """What this worker sends to the conversations' queues, and counts in its own."""

    def __init__(self, app: Celery, settings: ConvoqSettings) -> None:
        self._app = app
        self._settings = settings
        self.queues: list[str] = []
        """The queues this worker consumes, once its consumer is ready."""

    def send(
        self,
        task: str,
        conversation_id: str,
        *args: str,
        headers: dict[str, str] | None = None,
        pool: str | None = None,
    ) -> None:
        """Send ``task(conversation_id, *args)`` to the conversation's queue (of ``pool``)."""
        queue = self.queue_of(conversation_id, pool)
        self._app.send_task(task, args=[conversation_id, *args], queue=queue, headers=headers)

    def queue_of(self, conversation_id: str, pool: str | None) -> str:
        s = self._settings
        return routing.route(conversation_id, prefix=s.prefix, partitions=s.partitions, pool=pool)

    def pool_of(self, agent: str) -> str | None:
        """The pool that serves ``agent`` (``CONVOQ_AGENT_POOLS``; None: the default)."""
        return self._settings.agent_pools.get(agent)

    def consumed_here(self, conversation_id: str, agent: str) -> bool:
        """Whether this worker consumes the queue the kicks of ``agent``'s turns go to."""
        return self.queue_of(conversation_id, self.pool_of(agent)) in self.queues

    async def kick_agent(self, conversation_id: str, agent: str) -> None:
        """Send the conversation a drain on the queue of the pool that serves ``agent``."""
        pool = self.pool_of(agent)
        await asyncio.to_thread(self.send, routing.DRAIN_TASK, conversation_id, pool=pool)

    async def send_from_loop(
        self, task: str, conversation_id: str, *args: str, pool: str | None = None
    ) -> None:
        """:meth:`send` from the event loop (a broker round trip, on a thread)."""
        await asyncio.to_thread(self.send, task, conversation_id, *args, pool=pool)

    async def kick(self, conversation_id: str) -> None:
        """Send the conversation a drain (from the event loop)."""
        await self.send_from_loop(routing.DRAIN_TASK, conversation_id)

    def requeue(self, conversation_id: str, head: str, fence: int) -> None:
        """Send the conversation back through the broker with the lease kept for it, on
        the queue of this worker's own pool (``CONVOQ_POOL``): one this pool's workers
        consume, so the kept lease is not left to lapse on a queue nobody reads. A head
        whose agent another pool serves is moved there by the drain that takes it."""
        headers = {HEAD_HEADER: head, FENCE_HEADER: str(fence)}
        self.send(routing.DRAIN_TASK, conversation_id, headers=headers, pool=self._settings.pool)

    def waiting(self) -> int:
        """Messages waiting in the queues this worker consumes (broker round trips)."""
        total = 0
        with self._app.pool.acquire(block=True, timeout=5) as connection:
            channel = cast(Any, connection).default_channel
            for queue in self.queues:
                try:
                    total += channel.queue_declare(queue=queue, passive=True).message_count
                except ChannelError:  # kombu's Redis transport: no such list, no message
                    continue
        return total


def hints() -> tuple[str | None, int]:
    """The inbox head named by the kick this thread runs (the ``HEAD_HEADER`` a client
    sets when its turn went to an idle conversation) or None, and the fence of a lease kept
    for it by a drain that gave its slot up (``FENCE_HEADER``) or 0."""
    return kick_header(HEAD_HEADER), fence_of(kick_header(FENCE_HEADER))


def fence_of(header: str | None) -> int:
    """The fence a ``FENCE_HEADER`` names, 0 when absent or not a fence."""
    return int(header) if header and header.isdigit() and len(header) < 30 else 0


def kick_header(name: str) -> str | None:
    """A string header of the message of the task this thread runs, or None."""
    if not current_task:  # a proxy: false outside a task
        return None
    value = getattr(current_task.request, name, None)
    return value if isinstance(value, str) else None

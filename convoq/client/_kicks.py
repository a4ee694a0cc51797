"""The client's kicks: the Celery message that tells the workers a conversation has work.

A kick goes to the conversation's queue (:func:`convoq.queue.routing.route`), of the pool
serving the agent of the turn it is for when ``CONVOQ_AGENT_POOLS`` names one. Where the
broker is the store's Redis (and no task events are wanted) a submit's kick is built here
and pushed by the ``submit`` script itself, in the call that queues the turn
(:func:`convoq.queue.transport.kick_message`); every other kick goes through
``send_task``. A kick that cannot be sent loses nothing: the turn is queued in Redis and
the workers' sweeper picks it up.
"""

from __future__ import annotations

from collections.abc import Callable

from celery import Celery

from convoq.queue import routing
from convoq.queue.transport import direct_kicks, kick_message, send_kick
from convoq.settings import ConvoqSettings


class Kicks:
    """Sends the kicks of one client's conversations.

    Args:
        settings: the client's resolved settings (prefix, partitions, broker, fast paths).
        redis_url: the client's Redis (called when first needed: it may start the
            embedded server).
        sender: the client's Celery app for ``send_task`` (made on first use).
    """

    def __init__(
        self, settings: ConvoqSettings, redis_url: Callable[[], str], sender: Callable[[], Celery]
    ) -> None:
        self._settings = settings
        self._redis_url = redis_url
        self._sender = sender
        self._direct: bool | None = None

    @property
    def pooled(self) -> bool:
        """Whether ``CONVOQ_AGENT_POOLS`` names pools (else every kick goes to the default
        queues, and no agent needs reading)."""
        return bool(self._settings.agent_pools)

    def queue(self, conversation_id: str, agent: str | None = None) -> str:
        """The queue the conversation's kicks go to: of the pool serving ``agent`` when
        ``CONVOQ_AGENT_POOLS`` names one, else the default."""
        s = self._settings
        pool = s.agent_pools.get(agent) if agent is not None else None
        return routing.route(conversation_id, prefix=s.prefix, partitions=s.partitions, pool=pool)

    async def send(
        self,
        task: str,
        conversation_id: str,
        *args: str,
        head: str | None = None,
        agent: str | None = None,
    ) -> None:
        """Send ``task`` for the conversation (with ``args`` after its id) by ``send_task``
        (to the pool serving ``agent``, see :meth:`queue`)."""
        queue = self.queue(conversation_id, agent)
        await send_kick(self._sender(), task, queue, [conversation_id, *args], head=head)

    def direct(
        self, conversation_id: str, head: str, agent: str | None = None
    ) -> tuple[str, str] | None:
        """The kick of ``head``'s conversation for the submit script to push (queue list,
        kombu message) when the broker is the store's Redis; else None (send_task)."""
        if self._direct is None:
            s = self._settings
            self._direct = direct_kicks(
                self._redis_url(),
                s.broker_url,
                task_events=s.task_events,
                fast_paths_on=s.fast_paths,
            )
        if not self._direct:
            return None
        queue = self.queue(conversation_id, agent)
        return queue, kick_message(routing.DRAIN_TASK, queue, [conversation_id], head=head)

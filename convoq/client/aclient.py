"""``AsyncClient``: submit turns, follow them, decide approvals, read and clear history.

``submit`` checks everything first (nothing is queued for bad input), stores the turn with
the protocol's ``submit`` script, and, when the conversation was idle, sends the Celery
task ``convoq.drain(cid)`` by name to the conversation's queue. The client needs the
broker, not the worker code. If that send fails the turn is still safely queued in Redis:
the workers' sweeper picks it up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol

import redis.asyncio as aioredis

from convoq._sync import call_maybe_async
from convoq.client._base import (
    build_submission,
    check_call_id,
    check_turn_ref,
)
from convoq.client._connect import broker_url_for, resolve_redis_url, send_kick, sender_app
from convoq.client.handle import AsyncTurnHandle, TurnResult
from convoq.errors import ConfigurationError, UnknownAgentError
from convoq.ids import check_conversation_id
from convoq.limits import DEFAULT_MAX_ATTACHMENT_BYTES, DEFAULT_MAX_TURN_BYTES, Limits
from convoq.messages import Message
from convoq.redis import KeySchema, TurnProtocol, connect
from convoq.worker import routing
from convoq.worker.webhooks import verify_signature

log = logging.getLogger("convoq.client")

OnDone = Callable[[TurnResult], Any]


class TurnRef(Protocol):
    """Anything naming one turn: a handle of either flavour."""

    conversation_id: str
    turn_id: str


class AsyncClient:
    """Queue turns for convoq workers and follow them.

    Args:
        redis_url: the Redis holding memory and turns; ``None`` starts or reuses the
            embedded redis-server under ``home``.
        broker_url: the Celery broker; defaults to ``redis_url`` (``amqp://`` works too).
        prefix: key and queue prefix; must match the workers' ``CONVOQ_PREFIX``.
        partitions: number of queues; must match the workers' ``CONVOQ_PARTITIONS``.
        agents: profile names to accept; ``None`` checks the names running workers
            registered in Redis (and accepts any name while no worker has registered).
        webhook_secret: the workers' ``CONVOQ_WEBHOOK_SECRET``, for :meth:`verify_webhook`.
        max_attachment_bytes: largest attachment accepted by ``submit``.
        max_turn_bytes: largest user message (text plus attachments) accepted.
        home: where the embedded Redis lives when ``redis_url`` is ``None``.
        max_connections: Redis connections at most; more concurrent calls wait for one.

    Use one AsyncClient from one event loop (its connections belong to that loop).
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        broker_url: str | None = None,
        prefix: str = "convoq",
        partitions: int = 16,
        agents: Collection[str] | None = None,
        webhook_secret: str | None = None,
        max_attachment_bytes: int = DEFAULT_MAX_ATTACHMENT_BYTES,
        max_turn_bytes: int = DEFAULT_MAX_TURN_BYTES,
        home: Path | None = None,
        max_connections: int = 100,
    ) -> None:
        # Checked here: a bad count would only fail when routing, after the turn is stored.
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ConfigurationError(
                f"partitions must be an int >= 1 matching the workers' CONVOQ_PARTITIONS,"
                f" not {partitions!r}"
            )
        self.redis_url = resolve_redis_url(redis_url, home)
        self.broker_url = broker_url_for(self.redis_url, broker_url)
        self.prefix = prefix
        self.partitions = partitions
        self.webhook_secret = webhook_secret
        self._agents = frozenset(agents) if agents is not None else None
        self._limits = Limits(max_attachment_bytes, max_turn_bytes)
        self._max_connections = max_connections
        self._celery = sender_app(self.broker_url)
        self._redis: aioredis.Redis | None = None
        self._protocol: TurnProtocol | None = None
        self._registered: frozenset[str] = frozenset()
        self._watchers: set[asyncio.Task[None]] = set()

    @property
    def protocol(self) -> TurnProtocol:
        """The turn protocol on this client's Redis (connections open on first use)."""
        if self._protocol is None:
            self._redis = connect(self.redis_url, max_connections=self._max_connections)
            self._protocol = TurnProtocol(
                self._redis,
                KeySchema(self.prefix),
                max_attachment_bytes=self._limits.max_attachment_bytes,
                max_turn_bytes=self._limits.max_turn_bytes,
            )
        return self._protocol

    async def submit(
        self,
        conversation_id: str,
        message: str | Message,
        *,
        agent: str,
        idempotency_key: str | None = None,
        keep_last_turns: int | None = None,
        callback_url: str | None = None,
        on_done: OnDone | None = None,
        if_busy: Literal["queue", "reject"] = "queue",
    ) -> AsyncTurnHandle:
        """Queue a turn and return its handle at once.

        Args:
            conversation_id: whose history the turn sees and extends.
            message: the user's text, or a user :class:`Message` with images and files.
            agent: the profile that runs the turn.
            idempotency_key: a second submit with the same key returns the first turn.
            keep_last_turns: previous turns sent to the model (overrides the profile).
            callback_url: receives one signed POST when the turn is final.
            on_done: called with the :class:`TurnResult` in this process, once.
            if_busy: ``"reject"`` raises ConversationBusyError while a turn is in progress.

        Raises:
            InvalidConversationIdError, InvalidMessageError, AttachmentError,
            UnknownAgentError, ConversationBusyError: nothing was queued.
        """
        sub = build_submission(
            conversation_id,
            message,
            agent=agent,
            known_agents=self._agents,
            limits=self._limits,
            idempotency_key=idempotency_key,
            keep_last_turns=keep_last_turns,
            callback_url=callback_url,
            if_busy=if_busy,
        )
        if self._agents is None:
            await self._check_registered(sub.agent)
        stored = await self.protocol.submit(
            sub.conversation_id,
            sub.turn_id,
            agent=sub.agent,
            message=sub.message,
            options=sub.options,
            idempotency_key=sub.idempotency_key,
            if_busy=sub.if_busy,
        )
        if stored.position == 0 or stored.duplicate:
            # A duplicate kicks again: its first submit may have died before its kick.
            head = stored.turn_id if stored.position == 0 else None
            await self._send(routing.DRAIN_TASK, sub.conversation_id, head=head)
        handle = AsyncTurnHandle(self, sub.conversation_id, stored.turn_id)
        if on_done is not None:
            self._watch(handle, on_done)
        return handle

    def handle(self, conversation_id: str, turn_id: str) -> AsyncTurnHandle:
        """A handle on a turn submitted anywhere (no I/O: ``status()`` checks it exists)."""
        cid, tid = check_turn_ref(conversation_id, turn_id)
        return AsyncTurnHandle(self, cid, tid)

    async def approve(self, turn: TurnRef, call_id: str) -> None:
        """Approve a parked tool call; when all are decided the turn resumes on a worker."""
        await self._decide(turn, call_id, approved=True, reason=None)

    async def deny(self, turn: TurnRef, call_id: str, *, reason: str | None = None) -> None:
        """Deny a parked tool call; the model is told (with ``reason``) and goes on."""
        await self._decide(turn, call_id, approved=False, reason=reason)

    async def _decide(
        self, turn: TurnRef, call_id: str, *, approved: bool, reason: str | None
    ) -> None:
        cid, tid = check_turn_ref(turn.conversation_id, turn.turn_id)
        check_call_id(call_id)
        outcome = await self.protocol.decide(
            cid, tid, call_id=call_id, approved=approved, reason=reason
        )
        if outcome == "resume":
            await self._send(routing.RESUME_TASK, cid, tid)

    async def discard(self, turn: TurnRef, *, reason: str = "discarded") -> None:
        """Drop a parked turn: it ends cancelled, nothing is stored, later turns run."""
        cid, tid = check_turn_ref(turn.conversation_id, turn.turn_id)
        if await self.protocol.discard(cid, tid, reason=reason):
            await self._send(routing.DRAIN_TASK, cid)

    async def cancel(self, turn: TurnRef) -> Literal["cancelled", "stopping", "finished"]:
        """Cancel a turn: a queued one never runs; a running one stops at its next step
        and stores nothing; a parked one is discarded. ``"finished"``: too late."""
        cid, tid = check_turn_ref(turn.conversation_id, turn.turn_id)
        outcome = await self.protocol.cancel(cid, tid)
        if outcome == "cancelled":
            # It may have been the head nobody was running yet: wake the ones behind it.
            await self._send(routing.DRAIN_TASK, cid)
        return outcome

    async def history(
        self, conversation_id: str, *, last_turns: int | None = None
    ) -> list[Message]:
        """The stored messages of a conversation (optionally its last N turns)."""
        return await self.protocol.history(
            check_conversation_id(conversation_id), last_turns=last_turns
        )

    async def clear(self, conversation_id: str, *, force: bool = False) -> None:
        """Delete a conversation (ConversationBusyError while a turn runs, unless forced)."""
        await self.protocol.clear(check_conversation_id(conversation_id), force=force)

    async def registered_agents(self) -> frozenset[str]:
        """Profile names the running workers registered in Redis."""
        self._registered = await self.protocol.registered_agents()
        return self._registered

    async def workers(self) -> dict[str, dict[str, Any]]:
        """The running workers as they registered: name -> pid, queues, agents,
        started_ms and seen_ms (refreshed every sweep period; a stale one is dead)."""
        return await self.protocol.registered_workers()

    def verify_webhook(self, header: str, body: bytes | str, tolerance_s: int = 300) -> bool:
        """Check a callback's ``X-Convoq-Signature`` with this client's ``webhook_secret``."""
        if not self.webhook_secret:
            raise ConfigurationError(
                "verify_webhook needs the workers' secret: Client(webhook_secret=...)"
            )
        return verify_signature(self.webhook_secret, header, body, tolerance_s)

    async def _check_registered(self, agent: str) -> None:
        if agent in self._registered:
            return
        known = await self.registered_agents()
        if known and agent not in known:
            raise UnknownAgentError(
                f"no agent profile named {agent!r}; the workers run {sorted(known)}",
                agent=agent,
                known=sorted(known),
            )

    async def _send(
        self, task: str, conversation_id: str, *args: str, head: str | None = None
    ) -> None:
        queue = routing.route(conversation_id, prefix=self.prefix, partitions=self.partitions)
        await send_kick(self._celery, task, queue, [conversation_id, *args], head=head)

    def _watch(self, handle: AsyncTurnHandle, on_done: OnDone) -> None:
        task = asyncio.get_running_loop().create_task(self._notify(handle, on_done))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _notify(self, handle: AsyncTurnHandle, on_done: OnDone) -> None:
        result = await handle.wait(raise_on_error=False)
        try:
            await call_maybe_async(on_done, result)
        except Exception:
            log.exception("on_done callback for turn %s raised", handle.turn_id)

    async def aclose(self) -> None:
        """Stop pending ``on_done`` watchers and close connections."""
        for task in list(self._watchers):
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        if self._protocol is not None:
            await self._protocol.close()
        if self._redis is not None:
            await self._redis.aclose()
        self._protocol = self._redis = None
        await asyncio.to_thread(self._celery.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

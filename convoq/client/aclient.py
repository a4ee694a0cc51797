"""``AsyncClient``: the one implementation of the client, which the sync ``Client`` wraps.

The client holds its settings (``_settings.py``) and its connections: Redis, the turn
protocol on it, the Celery app that sends kicks (a forked child opens its own). Each job
is a part it composes and delegates to, in a module named for the job: submitting a turn
(``_base.py`` checks it, ``_submitting.py`` stores it), kicks (``_kicks.py``), a turn's
control and the approvals inbox (``_control.py``), a conversation's history, usage and
clearing (``_conversations.py``), the workers, their agents and ping (``_deployment.py``);
following a turn is its handle's (``handle.py``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Collection
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from celery import Celery

from convoq._connection_bounds import ConnectionBounds
from convoq._sync import left_in_parent
from convoq.client import _conversations, _deployment
from convoq.client._base import IfBusy, build_submission, check_turn_ref
from convoq.client._control import TurnControl, TurnRef
from convoq.client._deployment import Deployment, Registry, deployment
from convoq.client._kicks import Kicks
from convoq.client._renamed import renamed_keyword
from convoq.client._settings import client_settings
from convoq.client._submitting import OnDone, Submitting, Watchers
from convoq.client._unreachable import mapped
from convoq.client._world import WorldControl
from convoq.client.handle import AsyncTurnHandle
from convoq.errors import ConfigurationError, ConvoqError
from convoq.ids import check_conversation_id
from convoq.messages import Message
from convoq.model_settings import SettingsLike
from convoq.output import OutputType
from convoq.queue.signing import verify_signature
from convoq.queue.transport import Broker, broker_for, sender_app
from convoq.redis import TurnProtocol, connect
from convoq.redis._cluster import AsyncRedis
from convoq.redis._scheduling import ScheduledTurn
from convoq.redis.embedded import describe, url_or_embedded
from convoq.redis.protocol import ParkedTurn, Signalled
from convoq.redis.roles import ClientStore
from convoq.settings import ConvoqSettings
from convoq.usage import Usage

__all__ = ["AsyncClient", "OnDone", "TurnRef"]


class AsyncClient:
    """Queue turns for convoq workers and follow them.

    Every setting resolves as everywhere in convoq (:meth:`ConvoqSettings.resolve`): the
    argument when given, else its ``CONVOQ_*`` variable, else the embedded default; so a
    client started where the workers' environment is set reaches the same Redis, prefix and
    queues.

    Args:
        redis_url: the Redis holding memory and turns (``CONVOQ_REDIS_URL``); unset, the
            embedded redis-server under ``home``, started on first use.
        broker_url: the Celery broker (``CONVOQ_BROKER_URL``); defaults to the Redis.
        prefix: key and queue prefix; must match the workers' ``CONVOQ_PREFIX``.
        partitions: number of queues; must match the workers' ``CONVOQ_PARTITIONS``
            (``submit`` says so when live workers run another count).
        agents: profile names to accept; ``None`` checks the names running workers
            registered in Redis (and accepts any name while no worker has registered).
        webhook_secret: the workers' ``CONVOQ_WEBHOOK_SECRET``, for :meth:`verify_webhook`.
        max_attachment_bytes: largest attachment accepted by ``submit``.
        max_turn_bytes: largest user message (text plus attachments) accepted.
        home: where the embedded Redis lives when no Redis URL is set.
        max_connections: Redis connections at most; more concurrent calls wait for one.
        callback_allowed_networks: networks a ``callback_url`` may point into although
            they are not public (loopback, private ...; see :mod:`convoq.netguard`);
            ``None``: ``CONVOQ_CALLBACK_ALLOWED_NETWORKS``, else public addresses only
            (``""``: public only, whatever the environment). The workers check again at
            delivery with their ``CONVOQ_CALLBACK_ALLOWED_NETWORKS``.
        min_replicas_acked: replicas that must have a submitted turn before ``submit``
            returns, and a finished one before ``TurnHandle.wait`` reports it
            (``CONVOQ_MIN_REPLICAS_ACKED``; 0: the primary's word suffices). Fewer in time
            (after resends): NotDurableError.
        replica_ack_timeout_ms: how long each such confirmation may wait
            (``CONVOQ_REPLICA_ACK_TIMEOUT_MS``).
        settings: an already resolved :class:`ConvoqSettings` (the CLI and the gateway
            pass theirs) instead of the setting arguments above.

    Nothing is started or connected here: connections open on first use (or in
    ``async with``). Use one AsyncClient from one event loop (its connections belong to it).

    Raises:
        ConfigurationError: a setting (given or from the environment) is invalid.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        broker_url: str | None = None,
        prefix: str | None = None,
        partitions: int | None = None,
        agents: Collection[str] | None = None,
        webhook_secret: str | None = None,
        max_attachment_bytes: int | None = None,
        max_turn_bytes: int | None = None,
        home: Path | None = None,
        max_connections: int = 100,
        callback_allowed_networks: str | Collection[str] | None = None,
        min_replicas_acked: int | None = None,
        replica_ack_timeout_ms: int | None = None,
        settings: ConvoqSettings | None = None,
    ) -> None:
        self.settings = client_settings(
            settings,
            {
                "redis_url": redis_url,
                "broker_url": broker_url,
                "prefix": prefix,
                "partitions": partitions,
                "webhook_secret": webhook_secret,
                "max_attachment_bytes": max_attachment_bytes,
                "max_turn_bytes": max_turn_bytes,
                "home": home,
                "callback_allowed_networks": callback_allowed_networks,
                "min_replicas_acked": min_replicas_acked,
                "replica_ack_timeout_ms": replica_ack_timeout_ms,
            },
        )
        self.prefix = self.settings.prefix
        self.partitions = self.settings.partitions
        self.webhook_secret = self.settings.webhook_secret
        self._max_connections = max_connections
        self._bounds = ConnectionBounds.of(self.settings)
        self._redis_url: str | None = self.settings.redis_url
        self._celery: Celery | None = None
        self._redis: AsyncRedis | None = None
        self._protocol: ClientStore | None = None
        self._pid = os.getpid()
        # The parts doing the client's jobs (see the module docstring).
        self._kicks = Kicks(self.settings, lambda: self.redis_url, self._sender)
        self._registry = Registry(self)
        self._watchers = Watchers()
        self._submitting = Submitting(
            self, agents=agents, kicks=self._kicks, registry=self._registry, watchers=self._watchers
        )
        self._control = TurnControl(lambda: self.protocol, self._kicks)
        self._world = WorldControl(lambda: self.protocol, self._kicks, self.settings)

    @property
    def redis_url(self) -> str:
        """The Redis this client uses; without a configured one, the embedded server's
        (started here, on first use)."""
        if self._redis_url is None:
            self._redis_url = url_or_embedded(None, self.settings.home)
        return self._redis_url

    def redis_named(self) -> str:
        """Which Redis this client uses, for messages: its URL without the password, or
        the embedded server's directory (no I/O, nothing started)."""
        return describe(self.settings.redis_url, self.settings.home)

    @property
    def broker_url(self) -> str:
        """The Celery broker kicks go to: the configured one, else the Redis (as kombu
        takes it: the URL's options go in the transport options)."""
        return self._broker().url

    def _broker(self) -> Broker:
        return broker_for(self.redis_url, self.settings.broker_url, self._bounds)

    @property
    def protocol(self) -> ClientStore:
        """The turn protocol on this client's Redis (connections open on first use)."""
        self._leave_parent_connections()
        if self._protocol is None:
            self._redis = connect(
                self.redis_url, max_connections=self._max_connections, bounds=self._bounds
            )
            self._protocol = TurnProtocol.from_settings(self._redis, self.settings)
        return self._protocol

    @mapped
    async def connect(self) -> AsyncClient:
        """Start the embedded Redis if needed and open the connections now rather than on
        first use (``async with`` does this)."""
        if self._redis_url is None:
            self._redis_url = await asyncio.to_thread(url_or_embedded, None, self.settings.home)
        await self.protocol.redis.ping()
        return self

    @renamed_keyword("output_schema", "output_type")
    @mapped
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
        if_busy: IfBusy = "queue",
        max_history_tokens: int | None = None,
        model_settings: SettingsLike | None = None,
        output_type: OutputType | None = None,
        metadata: dict[str, Any] | None = None,
        output_schema: OutputType | None = None,
        not_before: datetime | None = None,
        delay_s: float | None = None,
    ) -> AsyncTurnHandle:
        """Queue a turn and return its handle at once.

        Args:
            conversation_id: whose history the turn sees and extends.
            message: the user's text, or a user :class:`Message` with images and files.
            agent: the profile that runs the turn.
            idempotency_key: a second submit with the same key and request returns the
                first turn; with another request (agent, message or options) it raises
                IdempotencyKeyReusedError naming what differs, and queues nothing.
            keep_last_turns: previous turns sent to the model (overrides the profile).
            callback_url: receives one signed POST when the turn is final (needs the
                workers' ``webhook_secret`` here too: without it InvalidCallbackUrlError).
            on_done: called with the :class:`TurnResult` in this process, once.
            if_busy: when the conversation is busy: ``"queue"`` behind its turns,
                ``"reject"`` raises ConversationBusyError, ``"interrupt"`` stops the
                running turn at its next step boundary (its finished steps stored) and
                answers this message with that history, ``"rollback"`` cancels it
                (nothing of it stored), ``"merge"`` joins a queued turn submitted with
                "merge" (one answer to both; the handle is that turn's, its
                ``merged_from`` the id this message was stored under). See
                docs/double-texting.md.
            max_history_tokens: send only the newest whole turns that fit this many tokens
                (overrides the profile; see :class:`convoq.window.Window`).
            model_settings: :class:`ModelSettings` or a dict of its fields, merged over
                the profile's for this turn.
            output_type: the answer's shape for this turn (a pydantic model, a dataclass
                or an object JSON schema; overrides the profile's output type), as
                ``output_type`` of an Agent: workers validate the answer against its JSON
                schema and the result carries it as JSON (``wait(output_type=...)`` gives
                it back typed).
            metadata: a JSON object (at most ``convoq.context.MAX_METADATA_BYTES``)
                stored with the turn and seen by its tools as ``ctx.metadata``.
            output_schema: the deprecated name of ``output_type`` (it warns with a
                DeprecationWarning; giving both is a ConvoqError).
            not_before: schedule the turn: it joins its conversation's line at this
                instant (a timezone-aware datetime), not now. Until then its status is
                ``scheduled`` (its record has ``due_ms``), it is in no inbox, and turns
                submitted meanwhile run before it; it is listed by :meth:`scheduled` and
                cancelled by :meth:`cancel`. Workers queue it at most
                ``CONVOQ_TIMER_INTERVAL_S`` late, never early (by Redis's clock).
            delay_s: schedule the turn this many seconds from now (Redis's clock), as
                ``not_before``; with both, it is due at the later of the two.

        Raises:
            InvalidConversationIdError: a bad conversation id; nothing was queued.
            InvalidMessageError: the message breaks a rule (named); nothing was queued.
            AttachmentError: an attachment is empty, of the wrong type or over its limit.
            InvalidCallbackUrlError: a callback URL that is not public (loopback, private
                and other non-public addresses too); nothing was queued.
            UnknownAgentError: no agent profile has that name; nothing was queued.
            InvalidModelSettingsError: a model setting is invalid; nothing was queued.
            InvalidOutputTypeError: ``output_type`` is not a usable object schema;
                nothing was queued.
            InvalidScheduleError: ``not_before`` or ``delay_s`` is invalid (a naive
                datetime, a delay out of range); nothing was queued.
            ConversationBusyError: ``if_busy="reject"`` and a turn is in progress (for
                a scheduled turn: now, when it is submitted).
            QueueFullError: a limit on queued turns (``CONVOQ_MAX_QUEUED_*``); nothing
                was queued.
            RedisUnavailableError: Redis cannot be reached or did not answer (named); so
                does every client and handle method.
        """
        # output_schema= arrives as output_type= (renamed_keyword moved it, warning).
        sub = build_submission(
            conversation_id,
            message,
            agent=agent,
            known_agents=self._submitting.known_agents,
            limits=self._submitting.limits,
            idempotency_key=idempotency_key,
            keep_last_turns=keep_last_turns,
            callback_url=callback_url,
            if_busy=if_busy,
            max_history_tokens=max_history_tokens,
            model_settings=model_settings,
            output_type=output_type,
            metadata=metadata,
            not_before=not_before,
            delay_s=delay_s,
        )
        return await self._submitting.submit(sub, on_done)

    @mapped
    async def scheduled(self, conversation_id: str, *, limit: int = 100) -> list[ScheduledTurn]:
        """The conversation's scheduled turns still waiting for their time, earliest
        first (at most ``limit``): each with its ``turn_id``, ``due_ms`` and record."""
        cid = check_conversation_id(conversation_id)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise ConvoqError(f"limit must be an int from 1 to 1000, not {limit!r}")
        return await self.protocol.scheduled_turns(cid, limit=limit)

    def handle(self, conversation_id: str, turn_id: str) -> AsyncTurnHandle:
        """A handle on a turn submitted anywhere (no I/O: ``status()`` checks it exists)."""
        cid, tid = check_turn_ref(conversation_id, turn_id)
        return AsyncTurnHandle(self, cid, tid)

    @mapped
    async def approve(
        self, turn: TurnRef, call_id: str, *, by: str | None = None, reason: str | None = None
    ) -> Literal["resume", "pending"]:
        """Approve a parked tool call; when all are decided the turn resumes on a worker.
        ``by`` (who decided) and ``reason`` are kept with the decision, its time too.
        Returns "resume" when this was the last call to decide, else "pending". The same
        decision again (a retry) answers as the first and changes nothing; only another
        verdict or reason on a decided call is refused (ProtocolError)."""
        return await self._control.decide(turn, call_id, approved=True, reason=reason, by=by)

    @mapped
    async def deny(
        self, turn: TurnRef, call_id: str, *, reason: str | None = None, by: str | None = None
    ) -> Literal["resume", "pending"]:
        """Deny a parked tool call; the model is told (with ``reason`` and ``by``) and goes
        on. Returns as :meth:`approve`."""
        return await self._control.decide(turn, call_id, approved=False, reason=reason, by=by)

    @mapped
    async def complete_call(
        self,
        turn: TurnRef,
        call_id: str,
        result: Any = None,
        *,
        error: str | None = None,
        by: str | None = None,
    ) -> Literal["resume", "pending"]:
        """Supply the result of a deferred tool call (its tool raised CallDeferred): the
        model reads ``result`` (a str as it is, anything else as JSON), or ``error`` as
        the call's error. ``by`` names the sender (kept with the result). Returns
        "resume" when it was the last call the turn waited for (it resumes on a worker),
        else "pending". The same result again answers as the first and changes nothing;
        another result for that call is refused (ProtocolError), as is one after the
        call's deadline."""
        return await self._world.complete_call(turn, call_id, result, error=error, by=by)

    @mapped
    async def signal(
        self,
        conversation_id: str,
        name: str,
        payload: Any = None,
        *,
        signal_id: str | None = None,
        by: str | None = None,
    ) -> Signalled:
        """Send the signal ``name`` to the conversation: the turn waiting for it
        (WaitForSignal) takes it and resumes, its call's result being ``payload``;
        with none waiting, it is kept for the next wait on that name (at most
        ``signal_max_kept`` live ones, each ``signal_ttl_s``; more are refused with
        SignalBacklogFullError). ``signal_id``: the same id sent again is a duplicate
        that changes nothing (a webhook's event id; None: a new one)."""
        return await self._world.signal(conversation_id, name, payload, signal_id=signal_id, by=by)

    @mapped
    async def discard(self, turn: TurnRef, *, reason: str = "discarded") -> None:
        """Drop a parked turn: it ends cancelled, nothing is stored, later turns run."""
        await self._control.discard(turn, reason=reason)

    @mapped
    async def cancel(self, turn: TurnRef) -> Literal["cancelled", "stopping", "finished"]:
        """Cancel a turn: a queued or scheduled one never runs (a scheduled one's timer
        goes with it); a running one is stopped within a lease
        period (even in the middle of a model call) and stores nothing; a parked one is
        discarded. ``"finished"``: too late."""
        return await self._control.cancel(turn)

    @mapped
    async def retry(self, turn: TurnRef, *, idempotency_key: str | None = None) -> AsyncTurnHandle:
        """Run a failed turn again, as the same turn: it goes to the back of its
        conversation's line (turns submitted after it ran meanwhile, so its answer now
        comes after theirs), with its id, its journal (the steps it finished are not run
        again; a tool call cut off mid-way runs again with the same
        ``ctx.idempotency_key``) and a fresh ``CONVOQ_MAX_ATTEMPTS`` budget. Its events go
        on after its first ``done`` (a ``retried`` event, then the new run's), and its
        handle's ``wait()`` and ``events()`` follow it again. A failed turn can be retried
        as long as its record is kept (``CONVOQ_TURN_TTL_S`` after it failed).

        ``idempotency_key``: the same key on a resent request (after a lost answer)
        retries once; without one, each call is a request of its own, and one made after
        the turn was queued again is refused (it is no longer failed).

        Returns the turn's handle; ``handle.repeated`` is True when this was a resend of
        an earlier request (same ``idempotency_key``), which changed nothing.

        Raises:
            TurnNotRetryableError: the turn did not fail (``details["status"]`` says where
                it stands); nothing changed.
            UnknownTurnError: no such turn, or its record expired.
            QueueFullError: a limit on queued turns; nothing changed.
        """
        retried = await self._control.retry(turn, idempotency_key=idempotency_key)
        handle = self.handle(turn.conversation_id, turn.turn_id)
        handle.repeated = retried.repeated
        return handle

    @mapped
    async def awaiting_approval(
        self, *, limit: int = 100, offset: int = 0, conversation_prefix: str = ""
    ) -> list[ParkedTurn]:
        """Turns parked for approval across conversations (those whose id starts with
        ``conversation_prefix``), newest first, ``limit`` of them from ``offset``: each
        record's ``result["pending_approvals"]`` are the tool calls waiting, with when it
        parked and when its approval expires. A scan of the keyspace: poll it, do not loop
        on it."""
        return await self._control.awaiting_approval(
            limit=limit, offset=offset, conversation_prefix=conversation_prefix
        )

    @mapped
    async def history(
        self, conversation_id: str, *, last_turns: int | None = None
    ) -> list[Message]:
        """The stored messages of a conversation (optionally its last N turns)."""
        return await _conversations.history(self.protocol, conversation_id, last_turns=last_turns)

    @mapped
    async def usage(self, conversation_id: str) -> Usage:
        """Tokens the conversation's stored turns reported, summed (one read, however long
        the history): ``requests`` model calls; all 0 for a server that reports none."""
        return await _conversations.usage(self.protocol, conversation_id)

    @mapped
    async def clear(self, conversation_id: str, *, force: bool = False) -> None:
        """Delete a conversation (ConversationBusyError while a turn runs, unless forced)."""
        await _conversations.clear(self.protocol, conversation_id, force=force)

    async def ping(self, timeout_s: float = 5.0) -> None:
        """Check that Redis and the broker answer within ``timeout_s`` each.

        Raises:
            RedisUnavailableError: Redis did not answer (named, with why).
            ConfigurationError: Redis answered with an error, or the broker did not
                answer (named, with why).
        """
        await _deployment.ping(self, self._sender, timeout_s)

    @mapped
    async def registered_agents(self) -> frozenset[str]:
        """Profile names the running workers registered in Redis."""
        return await self._registry.agents()

    @mapped
    async def deployment(self) -> Deployment:
        """The workers behind this client's Redis and prefix, alive or dead, whether any
        ever registered, and :meth:`Deployment.problem` (why turns would wait for ever;
        ``convoq status`` prints it)."""
        return await deployment(self)

    @mapped
    async def workers(self) -> dict[str, dict[str, Any]]:
        """The workers as they registered: name -> pid, queues, agents, started_ms,
        seen_ms, heartbeat_ms, and whether each is ``alive`` with when it was
        ``last_seen`` (ISO 8601, UTC; ``last_seen_s``: seconds ago). A worker that missed
        3 heartbeats (its sweep period, ``CONVOQ_SWEEP_INTERVAL_S``) is ``alive: False``;
        one that missed 12 is no longer listed."""
        return await self._registry.workers()

    def verify_webhook(self, header: str, body: bytes | str, tolerance_s: int = 300) -> bool:
        """Check a callback's ``X-Convoq-Signature`` with this client's ``webhook_secret``."""
        if not self.webhook_secret:
            raise ConfigurationError(
                "verify_webhook needs the workers' secret: Client(webhook_secret=...)"
            )
        return verify_signature(self.webhook_secret, header, body, tolerance_s)

    def _sender(self) -> Celery:
        self._leave_parent_connections()
        if self._celery is None:
            self._celery = sender_app(
                self._broker(),
                visibility_timeout_s=self.settings.visibility_timeout_s,
                task_events=self.settings.task_events,
            )
        return self._celery

    def _leave_parent_connections(self) -> None:
        """In a forked child: the connections and watchers so far are the parent's (its
        sockets, its loop); left alone, never closed here, new ones open on first use."""
        if self._pid != os.getpid():
            parents = self._watchers.forget()
            left_in_parent(self._redis, self._protocol, self._celery, parents)
            self._redis = self._protocol = self._celery = None
            self._pid = os.getpid()

    async def aclose(self) -> None:
        """Stop pending ``on_done`` watchers and close connections."""
        self._leave_parent_connections()
        await self._watchers.stop()
        if self._protocol is not None:
            await self._protocol.close()
        if self._redis is not None:
            await self._redis.aclose()
        self._protocol = self._redis = None
        if self._celery is not None:
            celery, self._celery = self._celery, None
            await asyncio.to_thread(celery.close)

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

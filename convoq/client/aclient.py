"""``AsyncClient``: submit turns, follow them, decide approvals, read and clear history.

``submit`` checks everything first (nothing is queued for bad input), stores the turn with
the protocol's ``submit`` script, and, when the conversation was idle, sends the Celery
task ``convoq.drain(cid)`` by name to the conversation's queue. Where the broker is the
store's Redis (and no task events are wanted, and the submit is not traced) that message
is built here and the ``submit`` script pushes it itself, in the call that queues the turn
(:func:`convoq.queue.transport.kick_message`); elsewhere ``send_task`` sends it. The
client needs the broker, not the worker code. If that send fails the turn is still safely
queued in Redis: the workers' sweeper picks it up.

A handle from ``submit`` knows its record as queued and the id of its "queued" event, so
its first ``wait`` blocks on the event stream at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Collection
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol

from celery import Celery
from redis.exceptions import RedisError

from convoq._sync import call_maybe_async, left_in_parent
from convoq.approvals import check_decision_note
from convoq.client._base import (
    Submission,
    build_submission,
    check_call_id,
    check_callback_signable,
    check_turn_ref,
    idempotency_conflict,
    idempotency_mismatch,
)
from convoq.client._deployment import Deployment, check_deployment, deployment
from convoq.client._unreachable import mapped, unavailable
from convoq.client.handle import AsyncTurnHandle, TurnResult
from convoq.errors import ConfigurationError, QueueFullError, UnknownAgentError, UnknownTurnError
from convoq.ids import check_conversation_id
from convoq.limits import Limits
from convoq.messages import Message
from convoq.model_settings import SettingsLike
from convoq.netguard import CallbackPolicy
from convoq.observe import metrics, tracing
from convoq.output import OutputType
from convoq.queue import routing
from convoq.queue.signing import verify_signature
from convoq.queue.transport import (
    broker_reachable,
    broker_url_for,
    direct_kicks,
    kick_message,
    send_kick,
    sender_app,
)
from convoq.redis import TurnProtocol, connect
from convoq.redis._base import REDIS_UNAVAILABLE
from convoq.redis._cluster import AsyncRedis
from convoq.redis._durable import until_durable
from convoq.redis.embedded import describe, url_or_embedded
from convoq.redis.protocol import ParkedTurn, SubmitResult
from convoq.redis.roles import ClientStore
from convoq.settings import ConvoqSettings
from convoq.usage import Usage

log = logging.getLogger("convoq.client")

OnDone = Callable[[TurnResult], Any]


def _networks_setting(value: str | Collection[str] | None) -> str | None:
    return value if value is None or isinstance(value, str) else ",".join(value)


class TurnRef(Protocol):
    """Anything naming one turn: a handle of either flavour."""

    conversation_id: str
    turn_id: str


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
        # Checked here: a bad count would only fail when routing, after the turn is stored.
        if partitions is not None and (
            isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1
        ):
            raise ConfigurationError(
                f"partitions must be an int >= 1 matching the workers' CONVOQ_PARTITIONS,"
                f" not {partitions!r}"
            )
        explicit = {
            "redis_url": redis_url,
            "broker_url": broker_url,
            "prefix": prefix,
            "partitions": partitions,
            "webhook_secret": webhook_secret,
            "max_attachment_bytes": max_attachment_bytes,
            "max_turn_bytes": max_turn_bytes,
            "home": home,
            "callback_allowed_networks": _networks_setting(callback_allowed_networks),
            "min_replicas_acked": min_replicas_acked,
            "replica_ack_timeout_ms": replica_ack_timeout_ms,
        }
        if settings is None:
            settings = ConvoqSettings.resolve(**explicit)
        elif given := sorted(name for name, value in explicit.items() if value is not None):
            raise ConfigurationError(
                f"pass either settings= or {given}, not both: settings are already resolved"
            )
        self.settings = settings
        self.prefix = self.settings.prefix
        self.partitions = self.settings.partitions
        self.webhook_secret = self.settings.webhook_secret
        self._agents = frozenset(agents) if agents is not None else None
        self._limits = Limits(self.settings.max_attachment_bytes, self.settings.max_turn_bytes)
        self._max_connections = max_connections
        self._redis_url: str | None = self.settings.redis_url
        self._celery: Celery | None = None
        self._direct_kicks: bool | None = None
        self._callback_policy = CallbackPolicy(self.settings.callback_allowed_networks)
        self._redis: AsyncRedis | None = None
        self._protocol: ClientStore | None = None
        self._registered: frozenset[str] = frozenset()
        self._deployment_checked = False
        self._watchers: set[asyncio.Task[None]] = set()
        self._pid = os.getpid()

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
        """The Celery broker kicks go to: the configured one, else the Redis."""
        return broker_url_for(self.redis_url, self.settings.broker_url)

    @property
    def protocol(self) -> ClientStore:
        """The turn protocol on this client's Redis (connections open on first use)."""
        self._leave_parent_connections()
        if self._protocol is None:
            self._redis = connect(self.redis_url, max_connections=self._max_connections)
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
        if_busy: Literal["queue", "reject"] = "queue",
        max_history_tokens: int | None = None,
        model_settings: SettingsLike | None = None,
        output_schema: OutputType | None = None,
        metadata: dict[str, Any] | None = None,
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
            if_busy: ``"reject"`` raises ConversationBusyError while a turn is in progress.
            max_history_tokens: send only the newest whole turns that fit this many tokens
                (overrides the profile; see :class:`convoq.window.Window`).
            model_settings: :class:`ModelSettings` or a dict of its fields, merged over
                the profile's for this turn.
            output_schema: the answer's shape for this turn (a pydantic model, a dataclass
                or an object JSON schema; overrides the profile's output type): workers
                validate the answer against its JSON schema and the result carries it as
                JSON (``wait(output_type=...)`` gives it back typed).
            metadata: a JSON object (at most ``convoq.context.MAX_METADATA_BYTES``)
                stored with the turn and seen by its tools as ``ctx.metadata``.

        Raises:
            InvalidConversationIdError: a bad conversation id; nothing was queued.
            InvalidMessageError: the message breaks a rule (named); nothing was queued.
            AttachmentError: an attachment is empty, of the wrong type or over its limit.
            InvalidCallbackUrlError: a callback URL that is not public (loopback, private
                and other non-public addresses too); nothing was queued.
            UnknownAgentError: no agent profile has that name; nothing was queued.
            InvalidModelSettingsError: a model setting is invalid; nothing was queued.
            InvalidOutputTypeError: ``output_schema`` is not a usable object schema;
                nothing was queued.
            ConversationBusyError: ``if_busy="reject"`` and a turn is in progress.
            QueueFullError: a limit on queued turns (``CONVOQ_MAX_QUEUED_*``); nothing
                was queued.
            RedisUnavailableError: Redis cannot be reached or did not answer (named); so
                does every client and handle method.
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
            max_history_tokens=max_history_tokens,
            model_settings=model_settings,
            output_schema=output_schema,
            metadata=metadata,
        )
        if "callback_url" in sub.options:
            check_callback_signable(sub.options, self.webhook_secret)
            await self._callback_policy.check_url(sub.options["callback_url"])
        if not self._deployment_checked:
            await self._check_deployment()
        if self._agents is None:
            await self._check_registered(sub.agent)
        attributes = {"convoq.conversation_id": sub.conversation_id, "convoq.agent": sub.agent}
        with tracing.span("convoq.submit", attributes):
            stored = await self._store(sub)
        handle = AsyncTurnHandle(self, sub.conversation_id, stored.turn_id)
        handle.repeated = stored.duplicate
        if not stored.duplicate and stored.event_id is not None:
            handle.queued_as(sub.agent, sub.message, sub.options, stored)
        if on_done is not None:
            self._watch(handle, on_done)
        return handle

    async def _store(self, sub: Submission) -> SubmitResult:
        """Store the turn (with this trace's context, for the worker) and kick if needed."""
        trace = tracing.carrier()
        options = {**sub.options, tracing.OPTION: trace} if trace else sub.options
        protocol = self.protocol
        await protocol.follow_retention()  # the idempotency key expires as the workers say
        # A traced kick is a span of its own, sent with send_task.
        kick = None if trace else self._direct_kick(sub.conversation_id, sub.turn_id)
        # Resent while replicas have not confirmed it: the same turn id makes it a replay.
        try:
            stored = await until_durable(
                lambda: protocol.submit(
                    sub.conversation_id,
                    sub.turn_id,
                    agent=sub.agent,
                    message=sub.message,
                    options=options,
                    idempotency_key=sub.idempotency_key,
                    if_busy=sub.if_busy,
                    kick=kick,
                ),
                f"submit of {sub.conversation_id}/{sub.turn_id}",
            )
        except QueueFullError as full:
            metrics.submit_refused(sub.agent, full.limit)
            raise
        tracing.set_attribute("convoq.turn_id", stored.turn_id)
        if stored.duplicate and stored.turn_id != sub.turn_id:
            await self._check_same_request(sub, stored.turn_id)
        if not stored.duplicate:
            metrics.turn_submitted(sub.agent)
        if stored.kicked:
            return stored
        if stored.position == 0 or stored.duplicate:
            # A duplicate kicks again: its first submit may have died before its kick.
            head = stored.turn_id if stored.position == 0 else None
            await self._send(routing.DRAIN_TASK, sub.conversation_id, head=head)
        return stored

    async def _check_same_request(self, sub: Submission, first: str) -> None:
        """An idempotency key answered with an earlier turn: refuse it unless that turn
        was asked for with the same request (a record gone by now cannot be compared)."""
        try:
            record = await self.protocol.get_turn(sub.conversation_id, first)
        except UnknownTurnError:
            return
        mismatch = idempotency_mismatch(sub, record, ignored=tracing.OPTION)
        if mismatch:
            raise idempotency_conflict(sub, first, mismatch)

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
        return await self._decide(turn, call_id, approved=True, reason=reason, by=by)

    @mapped
    async def deny(
        self, turn: TurnRef, call_id: str, *, reason: str | None = None, by: str | None = None
    ) -> Literal["resume", "pending"]:
        """Deny a parked tool call; the model is told (with ``reason`` and ``by``) and goes
        on. Returns as :meth:`approve`."""
        return await self._decide(turn, call_id, approved=False, reason=reason, by=by)

    async def _decide(
        self, turn: TurnRef, call_id: str, *, approved: bool, reason: str | None, by: str | None
    ) -> Literal["resume", "pending"]:
        cid, tid = check_turn_ref(turn.conversation_id, turn.turn_id)
        check_call_id(call_id)
        reason, by = check_decision_note(reason, by)
        decided = await self.protocol.record_decision(
            cid, tid, call_id=call_id, approved=approved, reason=reason, by=by
        )
        # A repeat (a retry after a lost answer) owes no resume: the first decision sent it.
        if decided.outcome == "resume" and not decided.repeated:
            attributes = {"convoq.conversation_id": cid, "convoq.turn_id": tid}
            with tracing.span("convoq.resume", attributes):  # the resume kick's trace
                await self._send(routing.RESUME_TASK, cid, tid)
        return decided.outcome

    @mapped
    async def discard(self, turn: TurnRef, *, reason: str = "discarded") -> None:
        """Drop a parked turn: it ends cancelled, nothing is stored, later turns run."""
        cid, tid = check_turn_ref(turn.conversation_id, turn.turn_id)
        await self.protocol.follow_retention()  # the record expires as the workers say
        if await self.protocol.discard(cid, tid, reason=reason):
            await self._uncount(cid, tid)
            await self._send(routing.DRAIN_TASK, cid)

    @mapped
    async def cancel(self, turn: TurnRef) -> Literal["cancelled", "stopping", "finished"]:
        """Cancel a turn: a queued one never runs; a running one is stopped within a lease
        period (even in the middle of a model call) and stores nothing; a parked one is
        discarded. ``"finished"``: too late."""
        cid, tid = check_turn_ref(turn.conversation_id, turn.turn_id)
        await self.protocol.follow_retention()  # the record expires as the workers say
        outcome = await self.protocol.cancel(cid, tid)
        if outcome == "cancelled":
            await self._uncount(cid, tid)
            # It may have been the head nobody was running yet: wake the ones behind it.
            await self._send(routing.DRAIN_TASK, cid)
        return outcome

    async def _uncount(self, cid: str, tid: str) -> None:
        """A turn ended here no longer counts against the per-agent and total limits."""
        if self.protocol.queue_limits.counted:
            await self.protocol.unadmit_quietly(cid, tid)

    @mapped
    async def history(
        self, conversation_id: str, *, last_turns: int | None = None
    ) -> list[Message]:
        """The stored messages of a conversation (optionally its last N turns)."""
        return await self.protocol.history(
            check_conversation_id(conversation_id), last_turns=last_turns
        )

    @mapped
    async def usage(self, conversation_id: str) -> Usage:
        """Tokens the conversation's stored turns reported, summed (one read, however long
        the history): ``requests`` model calls; all 0 for a server that reports none."""
        return await self.protocol.usage(check_conversation_id(conversation_id))

    @mapped
    async def clear(self, conversation_id: str, *, force: bool = False) -> None:
        """Delete a conversation (ConversationBusyError while a turn runs, unless forced)."""
        await self.protocol.clear(check_conversation_id(conversation_id), force=force)

    @mapped
    async def awaiting_approval(
        self, *, limit: int = 100, offset: int = 0, conversation_prefix: str = ""
    ) -> list[ParkedTurn]:
        """Turns parked for approval across conversations (those whose id starts with
        ``conversation_prefix``), newest first, ``limit`` of them from ``offset``: each
        record's ``result["pending_approvals"]`` are the tool calls waiting, with when it
        parked and when its approval expires. A scan of the keyspace: poll it, do not loop
        on it."""
        return await self.protocol.parked_turns(
            limit, offset=offset, conversation_prefix=conversation_prefix
        )

    async def ping(self, timeout_s: float = 5.0) -> None:
        """Check that Redis and the broker answer within ``timeout_s`` each.

        Raises:
            RedisUnavailableError: Redis did not answer (named, with why).
            ConfigurationError: Redis answered with an error, or the broker did not
                answer (named, with why).
        """
        try:
            await asyncio.wait_for(self.protocol.redis.ping(), timeout_s)
        except REDIS_UNAVAILABLE as exc:
            raise unavailable(self.redis_named(), exc) from None
        except (TimeoutError, OSError) as exc:  # the wait ran out, or the socket failed
            raise unavailable(self.redis_named(), exc) from None
        except RedisError as exc:
            raise ConfigurationError(f"Redis does not answer: {exc!r}"[:300]) from None
        await broker_reachable(self._sender(), timeout_s)

    @mapped
    async def registered_agents(self) -> frozenset[str]:
        """Profile names the running workers registered in Redis."""
        self._registered = await self.protocol.registered_agents()
        return self._registered

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
        return await self.protocol.registered_workers(heartbeat_s=self.settings.sweep_interval_s)

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

    async def _check_deployment(self) -> None:
        """Once per client (see :func:`convoq.client._deployment.check_deployment`)."""
        await check_deployment(self)
        self._deployment_checked = True

    async def _stall_note(self) -> str:
        """Why a turn of this client may wait for ever ("" when a worker is alive): for
        the message of a wait that ran out."""
        return (await deployment(self)).problem() or ""

    async def _send(
        self, task: str, conversation_id: str, *args: str, head: str | None = None
    ) -> None:
        queue = routing.route(conversation_id, prefix=self.prefix, partitions=self.partitions)
        await send_kick(self._sender(), task, queue, [conversation_id, *args], head=head)

    def _direct_kick(self, cid: str, head: str) -> tuple[str, str] | None:
        """The kick of ``head``'s conversation for the submit script to push (queue list,
        kombu message) when the broker is the store's Redis; else None (send_task)."""
        if self._direct_kicks is None:
            self._direct_kicks = direct_kicks(
                self.redis_url,
                self.settings.broker_url,
                task_events=self.settings.task_events,
                fast_paths_on=self.settings.fast_paths,
            )
        if not self._direct_kicks:
            return None
        queue = routing.route(cid, prefix=self.prefix, partitions=self.partitions)
        return queue, kick_message(routing.DRAIN_TASK, queue, [cid], head=head)

    def _sender(self) -> Celery:
        self._leave_parent_connections()
        if self._celery is None:
            self._celery = sender_app(
                self.broker_url,
                visibility_timeout_s=self.settings.visibility_timeout_s,
                task_events=self.settings.task_events,
            )
        return self._celery

    def _watch(self, handle: AsyncTurnHandle, on_done: OnDone) -> None:
        task = asyncio.get_running_loop().create_task(self._notify(handle, on_done))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _notify(self, handle: AsyncTurnHandle, on_done: OnDone) -> None:
        result = await handle.wait(raise_on_error=False, until="final")
        try:
            await call_maybe_async(on_done, result)
        except Exception:
            log.exception("on_done callback for turn %s raised", handle.turn_id)

    def _leave_parent_connections(self) -> None:
        """In a forked child: the connections and watchers so far are the parent's (its
        sockets, its loop); left alone, never closed here, new ones open on first use."""
        if self._pid != os.getpid():
            left_in_parent(self._redis, self._protocol, self._celery, self._watchers)
            self._redis = self._protocol = self._celery = None
            self._watchers, self._pid = set(), os.getpid()

    async def aclose(self) -> None:
        """Stop pending ``on_done`` watchers and close connections."""
        self._leave_parent_connections()
        for task in list(self._watchers):
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
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

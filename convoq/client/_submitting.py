"""Submitting a turn: the I/O after :func:`convoq.client._base.build_submission` checked it.

The callback URL is resolved and checked, the deployment checked once per client and the
agent name against the workers' registry; then the protocol's ``submit`` script stores the
turn (resent until the replicas asked for confirm it: the same turn id makes a resend a
replay) and, when the conversation was idle, the drain kick goes out
(:class:`~convoq.client._kicks.Kicks`). If that send fails the turn is still safely queued
in Redis: the workers' sweeper picks it up.

A handle from ``submit`` knows its record as queued and the id of its "queued" event, so
its first ``wait`` blocks on the event stream at once. An ``on_done`` callback is a task on
the client's loop, waiting on that handle.

A turn with a due time (``not_before`` / ``delay_s``) is stored by the ``schedule``
script instead (:mod:`convoq.redis._scheduling`): no kick, as it joins no line until the
workers' timer poll queues it; it does not count against the queued-turn limits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from convoq._sync import call_maybe_async
from convoq.client._base import (
    Submission,
    check_callback_signable,
    check_scheduled_if_busy,
    idempotency_conflict,
    idempotency_mismatch,
)
from convoq.client._deployment import Registry
from convoq.client._kicks import Kicks
from convoq.client.handle import AsyncTurnHandle, TurnResult
from convoq.errors import QueueFullError, UnknownTurnError
from convoq.limits import Limits
from convoq.netguard import CallbackPolicy
from convoq.observe import metrics, tracing
from convoq.queue import routing
from convoq.redis._durable import until_durable
from convoq.redis.protocol import SubmitResult

if TYPE_CHECKING:
    from convoq.client.aclient import AsyncClient

log = logging.getLogger("convoq.client")

OnDone = Callable[[TurnResult], Any]


class Watchers:
    """The ``on_done`` callbacks of one client: each a task on its loop that waits for
    its turn to be final, then calls back once."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def watch(self, handle: AsyncTurnHandle, on_done: OnDone) -> None:
        task = asyncio.get_running_loop().create_task(_notify(handle, on_done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def forget(self) -> set[asyncio.Task[None]]:
        """Start afresh (in a forked child) and return the tasks so far, the parent's."""
        tasks, self._tasks = self._tasks, set()
        return tasks

    async def stop(self) -> None:
        """Cancel the pending watchers and wait for them to end."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _notify(handle: AsyncTurnHandle, on_done: OnDone) -> None:
    result = await handle.wait(raise_on_error=False, until="final")
    try:
        await call_maybe_async(on_done, result)
    except Exception:
        log.exception("on_done callback for turn %s raised", handle.turn_id)


class Submitting:
    """Queues checked turns for one client.

    Args:
        client: the client whose store the turns go to and whose handles they get.
        agents: profile names to accept (None: those the workers registered).
        kicks: the client's kicks.
        registry: what the client knows of its workers.
        watchers: where ``on_done`` callbacks wait.
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        agents: Collection[str] | None,
        kicks: Kicks,
        registry: Registry,
        watchers: Watchers,
    ) -> None:
        s = client.settings
        self._client = client
        self.known_agents = frozenset(agents) if agents is not None else None
        self.limits = Limits(s.max_attachment_bytes, s.max_turn_bytes)
        self._callback_policy = CallbackPolicy(s.callback_allowed_networks)
        self._kicks = kicks
        self._registry = registry
        self._watchers = watchers

    async def submit(self, sub: Submission, on_done: OnDone | None) -> AsyncTurnHandle:
        """Queue ``sub`` (see ``AsyncClient.submit``) and return its handle."""
        if "callback_url" in sub.options:
            check_callback_signable(sub.options, self._client.webhook_secret)
            await self._callback_policy.check_url(sub.options["callback_url"])
        await self._registry.check_once()
        if self.known_agents is None:
            await self._registry.check_agent(sub.agent)
        attributes = {"convoq.conversation_id": sub.conversation_id, "convoq.agent": sub.agent}
        with tracing.span("convoq.submit", attributes):
            stored = await (self._schedule(sub) if sub.due is not None else self._store(sub))
        answered_by = stored.merged_into or await self._merged_into(sub, stored)
        handle = AsyncTurnHandle(self._client, sub.conversation_id, answered_by or stored.turn_id)
        handle.repeated = stored.duplicate
        handle.merged_from = stored.turn_id if answered_by else None
        if not stored.duplicate and stored.event_id is not None:
            handle.queued_as(sub.agent, sub.message, sub.options, stored)
        if on_done is not None:
            self._watchers.watch(handle, on_done)
        return handle

    async def _store(self, sub: Submission) -> SubmitResult:
        """Store the turn (with this trace's context, for the worker) and kick if needed."""
        trace = tracing.carrier()
        options = {**sub.options, tracing.OPTION: trace} if trace else sub.options
        protocol = self._client.protocol
        await protocol.follow_retention()  # the idempotency key expires as the workers say
        # A traced kick is a span of its own, sent with send_task.
        kick = None if trace else self._kicks.direct(sub.conversation_id, sub.turn_id, sub.agent)
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
                    merge_key=sub.merge_key,
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
        if stored.position == 0 or stored.duplicate or stored.stopped == "cancelled":
            # A duplicate kicks again: its first submit may have died before its kick.
            head = stored.turn_id if stored.position == 0 else None
            await self._kicks.send(
                routing.DRAIN_TASK, sub.conversation_id, head=head, agent=sub.agent
            )
        return stored

    async def _merged_into(self, sub: Submission, stored: SubmitResult) -> str | None:
        """A repeated merge submit: the turn that answers the first one, when it was
        merged (its record ends "merged"); else None."""
        if not (stored.duplicate and sub.if_busy == "merge"):
            return None
        try:
            record = await self._client.protocol.get_turn(sub.conversation_id, stored.turn_id)
        except UnknownTurnError:
            return None
        return record.merged_into

    async def _schedule(self, sub: Submission) -> SubmitResult:
        """Store a scheduled turn and its timer (no kick: it joins no line yet)."""
        assert sub.due is not None
        due = sub.due
        protocol = self._client.protocol
        await protocol.follow_retention()  # the idempotency key expires as the workers say
        stored = await until_durable(
            lambda: protocol.schedule(
                sub.conversation_id,
                sub.turn_id,
                agent=sub.agent,
                message=sub.message,
                options=sub.options,
                due=due,
                idempotency_key=sub.idempotency_key,
                if_busy=check_scheduled_if_busy(sub.if_busy),
            ),
            f"schedule of {sub.conversation_id}/{sub.turn_id}",
        )
        tracing.set_attribute("convoq.turn_id", stored.turn_id)
        if stored.duplicate and stored.turn_id != sub.turn_id:
            await self._check_same_request(sub, stored.turn_id)
        return SubmitResult(stored.turn_id, -1, duplicate=stored.duplicate)

    async def _check_same_request(self, sub: Submission, first: str) -> None:
        """An idempotency key answered with an earlier turn: refuse it unless that turn
        was asked for with the same request (a record gone by now cannot be compared)."""
        try:
            record = await self._client.protocol.get_turn(sub.conversation_id, first)
        except UnknownTurnError:
            return
        mismatch = idempotency_mismatch(sub, record, ignored=tracing.OPTION)
        if mismatch:
            raise idempotency_conflict(sub, first, mismatch)

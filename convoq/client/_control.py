"""A turn's control from the client: approve or deny its parked tool calls, discard it,
cancel it, retry it when it failed, and list the turns parked for approval (the approvals
inbox).

A decision that completes a parked turn's approvals sends the ``resume`` kick; a turn
ended here (discarded, or cancelled before it ran) no longer counts against the queue
limits and wakes the turn now first in line; a failed turn retried into an idle
conversation sends it a ``drain`` kick. Each kick goes to the queue of the pool serving
the agent of the turn it is for (``CONVOQ_AGENT_POOLS``), which the script that decided,
ended or queued it answers along: the turn's own, or the id of the one now first in line,
whose agent is then read (one read, only when pools are named).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from typing import Literal, Protocol

from convoq.approvals import check_decision_note
from convoq.client._base import check_call_id, check_idempotency_key, check_turn_ref
from convoq.client._kicks import Kicks
from convoq.observe import tracing
from convoq.queue import routing
from convoq.redis.protocol import ParkedTurn, Retried
from convoq.redis.roles import ClientStore

Outcome = Literal["resume", "pending"]


class TurnRef(Protocol):
    """Anything naming one turn: a handle of either flavour."""

    conversation_id: str
    turn_id: str


class TurnControl:
    """Decides, discards and cancels turns on one client's store.

    Args:
        store: the client's turn protocol (called on each use: connections open lazily
            and a forked child opens its own).
        kicks: the client's kicks (``resume`` after the last decision, ``drain`` after a
            turn ended here).
    """

    def __init__(self, store: Callable[[], ClientStore], kicks: Kicks) -> None:
        self._store = store
        self._kicks = kicks

    async def decide(
        self, turn: TurnRef, call_id: str, *, approved: bool, reason: str | None, by: str | None
    ) -> Outcome:
        """Record one decision on a parked call (see ``AsyncClient.approve``)."""
        cid, tid = check_turn_ref(turn.conversation_id, turn.turn_id)
        check_call_id(call_id)
        reason, by = check_decision_note(reason, by)
        decided = await self._store().record_decision(
            cid, tid, call_id=call_id, approved=approved, reason=reason, by=by
        )
        # A repeat (a retry after a lost answer) owes no resume: the first decision sent it.
        if decided.outcome == "resume" and not decided.repeated:
            attributes = {"convoq.conversation_id": cid, "convoq.turn_id": tid}
            with tracing.span("convoq.resume", attributes):  # the resume kick's trace
                await self._kicks.send(routing.RESUME_TASK, cid, tid, agent=decided.agent)
        return decided.outcome

    async def discard(self, turn: TurnRef, *, reason: str) -> None:
        """Drop a parked turn (see ``AsyncClient.discard``)."""
        cid, tid = check_turn_ref(turn.conversation_id, turn.turn_id)
        store = self._store()
        await store.follow_retention()  # the record expires as the workers say
        head = await store.discard_turn(cid, tid, reason=reason)
        if head is not None:
            await self._uncount(store, cid, tid)
            await kick_head(self._kicks, store, cid, head)

    async def cancel(self, turn: TurnRef) -> Literal["cancelled", "stopping", "finished"]:
        """Cancel a turn (see ``AsyncClient.cancel``)."""
        cid, tid = check_turn_ref(turn.conversation_id, turn.turn_id)
        store = self._store()
        await store.follow_retention()  # the record expires as the workers say
        outcome, head = await store.cancel_turn(cid, tid)
        if outcome == "cancelled":
            await self._uncount(store, cid, tid)
            # It may have been the head nobody was running yet: wake the one now first.
            if head is not None:
                await kick_head(self._kicks, store, cid, head)
        return outcome

    async def retry(self, turn: TurnRef, *, idempotency_key: str | None) -> Retried:
        """Queue a failed turn again as the same turn (see ``AsyncClient.retry``)."""
        cid, tid = check_turn_ref(turn.conversation_id, turn.turn_id)
        token = retry_token(check_idempotency_key(idempotency_key))
        store = self._store()
        await store.follow_retention()  # a failed turn's record expires as the workers say
        retried = await store.retry(cid, tid, token=token)
        # First in line: wake a worker. A resend may have lost the first answer and its
        # kick; a kick more is harmless (the drain finds the lease held, or the inbox).
        if (retried.position == 0 and not retried.repeated) or retried.status == "queued":
            await self._kicks.send(routing.DRAIN_TASK, cid, head=tid, agent=retried.agent)
        return retried

    async def awaiting_approval(
        self, *, limit: int, offset: int, conversation_prefix: str
    ) -> list[ParkedTurn]:
        """Turns parked for approval (see ``AsyncClient.awaiting_approval``)."""
        return await self._store().parked_turns(
            limit, offset=offset, conversation_prefix=conversation_prefix
        )

    @staticmethod
    async def _uncount(store: ClientStore, cid: str, tid: str) -> None:
        """A turn ended here no longer counts against the per-agent and total limits."""
        if store.queue_limits.counted:
            await store.unadmit_quietly(cid, tid)


async def kick_head(
    kicks: Kicks, store: ClientStore, cid: str, head: str, agent: str | None = None
) -> None:
    """Send the conversation a drain for its inbox head ``head`` on the queue of the pool
    serving its agent: ``agent`` when the script that freed it read it, else the one its
    record names (one read, only when ``CONVOQ_AGENT_POOLS`` names pools)."""
    if agent is None and kicks.pooled:
        agent = await store.turn_agent(cid, head)
    await kicks.send(routing.DRAIN_TASK, cid, agent=agent)


def retry_token(idempotency_key: str | None) -> str:
    """The token of one retry request: from the caller's idempotency key (a resend of the
    same request carries the same key), else new for each call (redis-py's own resend of
    the script after a lost reply carries the same token all the same)."""
    if idempotency_key is None:
        return uuid.uuid4().hex
    return "k" + hashlib.sha256(idempotency_key.encode()).hexdigest()

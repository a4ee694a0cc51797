"""Holding a conversation while one of its turns runs: the lease renewed in the background,
and the turn's events buffered until its next fenced write carries them (a journal entry
per step, then commit, fail or park)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from convoq.errors import LeaseLostError, StaleFenceError
from convoq.observe import metrics
from convoq.redis.protocol import Acquired, TurnEvents, TurnProtocol
from convoq.turn_state import TurnState, answered

log = logging.getLogger("convoq.worker")
T = TypeVar("T")


@dataclass
class TurnRun:
    """One run of a turn: its lease, the events on their way to its stream, and the
    cancel flag as last seen. ``checkpoint`` and ``should_stop`` are the turn loop's hooks."""

    protocol: TurnProtocol
    acq: Acquired
    events: TurnEvents
    cancel_seen: bool = False
    flag_read: bool = False

    async def checkpoint(self, state: TurnState) -> None:
        """Journal a finished step, with the events buffered so far."""
        if answered(state):
            # The commit journals a final answer: it follows at once (emits only buffer,
            # the stop check reads nothing), in the round trip this write would take.
            return
        turn = self.acq.turn
        async with self.events.pending() as events:
            self.cancel_seen = await self.protocol.checkpoint(
                turn.conversation_id, turn.turn_id, fence=self.acq.fence, state=state, events=events
            )

    async def should_stop(self) -> bool:
        """Whether a cancel was requested. Each checkpoint reports the cancel flag and the
        commit refuses a flagged turn, so no read per step. Only a rerun or a resumed turn
        may start flagged: cancel flags running turns only, and ends a queued one at once."""
        turn = self.acq.turn
        if not self.flag_read and (turn.attempts > 1 or self.acq.state is not None):
            self.cancel_seen = await self.protocol.is_cancel_requested(
                turn.conversation_id, turn.turn_id
            )
        self.flag_read = True
        return self.cancel_seen


@contextlib.asynccontextmanager
async def turn_run(
    protocol: TurnProtocol, acq: Acquired, *, flush_after_s: float
) -> AsyncIterator[TurnRun]:
    """A run of ``acq``'s turn; events still buffered when it ends are dropped (the turn
    ended, and its last write carried them, or it was abandoned)."""
    turn = acq.turn
    events = TurnEvents(protocol, turn.conversation_id, turn.turn_id, flush_after_s=flush_after_s)
    try:
        yield TurnRun(protocol, acq, events)
    finally:
        await events.close()


async def with_lease(
    protocol: TurnProtocol, acq: Acquired, lease_ms: int, work: Coroutine[Any, Any, T]
) -> T:
    """Run ``work`` while renewing the lease; cancel it and raise LeaseLostError if the
    lease is lost."""
    task = asyncio.ensure_future(work)
    renewer = asyncio.create_task(_renew(protocol, acq, lease_ms))
    try:
        await asyncio.wait({task, renewer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        lost = not task.done()
        for pending in (task, renewer):
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pending
    if lost:
        raise LeaseLostError("the lease was lost while the turn ran")
    return task.result()


async def _renew(protocol: TurnProtocol, acq: Acquired, lease_ms: int) -> None:
    """Renew every lease_ms/3; a transient error is retried until the lease would lapse."""
    cid = acq.turn.conversation_id
    period = lease_ms / 3000
    loop = asyncio.get_running_loop()
    renewed_at = loop.time()
    while True:
        await asyncio.sleep(period)
        try:
            await protocol.renew(cid, fence=acq.fence, lease_ms=lease_ms)
            renewed_at = loop.time()
            metrics.LEASE_RENEWALS.inc()
        except StaleFenceError:
            return
        except Exception as exc:
            metrics.LEASE_RENEWAL_ERRORS.inc()
            if loop.time() - renewed_at > lease_ms / 1000:
                log.error("cannot renew the lease on %s: %s", cid, exc)
                return
            log.warning("renewing the lease on %s failed, retrying: %s", cid, exc)

"""The timer poll: scheduled turns join their conversation's line when they are due.

Every worker process runs this loop on its event loop, beside the sweeper: every
``interval_s`` (``CONVOQ_TIMER_INTERVAL_S``) it reads the conversations whose index entry
is due by the Redis clock (one ``ZRANGEBYSCORE``), fires each one's due timers
(:meth:`~convoq.redis.protocol.TurnProtocol.fire_due`: the turns join the back of the
inbox as queued) and kicks a conversation that was idle. So a turn is queued at most one
interval (plus the round trips) after it is due, and never before: its due time is
compared with the Redis clock inside the script. Pollers of several processes may race on
a conversation: the script's ``ZREM`` decides, a timer fires once. Each turn queued is
counted where it fired (``convoq_timers_fired_total``, and its lag after its due time by
the script's clock in ``convoq_timer_lag_seconds``).

A process killed after a fire and before its kick leaves a queued turn with no lease:
the sweeper kicks it. A scheduling client killed between its two writes leaves a timer
without an index entry: the process that sweeps in a period repairs the index from a
SCAN of the timers keys after its sweep
(:meth:`~convoq.redis.protocol.TurnProtocol.repair_timer_index`, see ``_heartbeat.py``),
and sets ``convoq_timers_waiting`` from the timers it counted.
"""

from __future__ import annotations

import asyncio
import logging
import random

from convoq.observe import metrics
from convoq.redis._scheduling import DUE_BATCH
from convoq.redis.roles import TimerStore
from convoq.worker.sweeper import Kick

log = logging.getLogger("convoq.timers")


class TimerPoll:
    """Fires due timers and kicks the conversations they woke (see the module docstring)."""

    def __init__(self, store: TimerStore, kick: Kick, *, interval_s: float) -> None:
        self._store = store
        self._kick = kick
        self._interval_s = interval_s

    async def poll_once(self) -> int:
        """Fire every due conversation's timers (in rounds of the index's batch); return
        how many turns were queued."""
        queued = 0
        while True:
            due, _ = await self._store.due_conversations()
            for cid in due:
                queued += await self._fire(cid)
            if len(due) < DUE_BATCH:
                return queued

    async def _fire(self, cid: str) -> int:
        fired = await self._store.fire_due(cid)
        metrics.timers_fired(fired.lags_ms)
        if fired.position == 0:
            try:
                await self._kick(cid)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the sweeper kicks it: it has queued turns, no lease
                log.warning("could not kick %s after its timers fired (%r)", cid, exc)
        return fired.queued

    async def run_forever(self) -> None:
        """Poll every ``interval_s`` until cancelled; errors are logged, the next poll
        tries again."""
        while True:
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("timer poll failed; trying again next interval")
            await asyncio.sleep(self._interval_s * random.uniform(0.8, 1.0))

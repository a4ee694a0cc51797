"""Telling a run that was cut off from one that crashed.

A run whose worker dies never comes back to say so; a run whose worker lost its lease
while it lived (the network to Redis went down for longer than the lease, Redis was
unreachable, the process stalled) can. This worker reports such a run as soon as Redis
answers again (:meth:`~convoq.redis.protocol.TurnProtocol.report_cut_off`): the run is
given back, so ``max_attempts`` counts crashes only (runs nobody reported) and a network
that flaps, then holds, does not fail the turn; ``max_cut_offs`` bounds cut-offs apart.

The report is retried while Redis is away, for :data:`REPORT_FOR_S` at most and never once
the worker shuts down: a run not reported by then counts as crashed, which errs on the
bounded side. Each try is bounded too (a black-holed connection may never answer).
"""

from __future__ import annotations

import asyncio
import logging

from convoq.redis._base import REDIS_UNAVAILABLE
from convoq.redis.protocol import Acquired
from convoq.redis.roles import RunnerStore
from convoq.worker._bounded import bounded
from convoq.worker._lease import Closing

log = logging.getLogger("convoq.worker")

REPORT_FOR_S = 120.0
"""How long a worker keeps trying to report a run it lost (then it counts as crashed)."""
# Pauses between tries while Redis is away: the first, and the longest.
_PAUSE_FIRST_S, _PAUSE_MAX_S = 0.05, 1.0
# Redis cannot be reached, or a try was not answered in time (bounded()).
_UNANSWERED: tuple[type[Exception], ...] = (*REDIS_UNAVAILABLE, TimeoutError)


async def report_cut_off(
    store: RunnerStore,
    acq: Acquired,
    *,
    closing: Closing,
    try_for_s: float,
    report_for_s: float = REPORT_FOR_S,
) -> bool:
    """Report ``acq``'s run cut off once Redis answers; each try waits ``try_for_s`` at
    most. True when the run was counted as cut off (False: reported already, the turn
    moved on, or Redis did not answer within ``report_for_s``, or shutdown began)."""
    cid, tid = acq.conversation_id, acq.turn.turn_id
    loop = asyncio.get_running_loop()
    deadline = loop.time() + report_for_s
    pause = _PAUSE_FIRST_S
    while not closing.is_set():
        try:
            counted = await bounded(store.report_cut_off(cid, tid, fence=acq.fence), try_for_s)
        except _UNANSWERED as exc:
            if loop.time() + pause >= deadline:
                log.warning(
                    "could not report turn %s/%s cut off (%s): counts as crashed", cid, tid, exc
                )
                return False
        except Exception as exc:  # a damaged record: the run counts as crashed, no more
            log.error("reporting turn %s/%s cut off failed: %s", cid, tid, exc)
            return False
        else:
            if counted:
                log.info("turn %s/%s: run reported cut off, not crashed", cid, tid)
            return counted
        await asyncio.sleep(pause)
        pause = min(2 * pause, _PAUSE_MAX_S)
    return False

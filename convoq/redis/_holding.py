"""In-process turns under the conversation's lease: the single-writer protocol for writers
that are not workers (an :class:`~convoq.agent.Agent` with Redis memory).

Such a turn takes the same lease a worker takes (``reserve``), so a worker's ``acquire``
answers BUSY while it runs, and it waits behind queued or running worker turns. It renews
the lease like a worker, parks it while its tool calls await approval (``unreserve``
park), and stores its messages with the fenced ``append`` that frees the lease in the
same step. Its turn token is the append id: a resent commit stores nothing twice.
A continuation's token is spent in Redis when it is resumed or discarded (a key per
token, expiring with the continuation), so it runs once whichever process resumes it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from convoq.errors import ConversationBusyError
from convoq.messages import Message
from convoq.redis._durable import replicated
from convoq.redis._history import append_history
from convoq.redis._replies import Outcome, ReserveReply
from convoq.redis.roles import HeldStore


class BusyWait:
    """The pauses between tries of a busy conversation: ``first_s``, doubling up to
    ``max_s``, until ``wait_s`` from when it was made have passed."""

    def __init__(self, wait_s: float, first_s: float, max_s: float) -> None:
        self._deadline = time.monotonic() + wait_s
        self._delay = first_s
        self._max_s = max_s

    async def pause(self, busy: ConversationBusyError) -> None:
        """Sleep until the next try, or raise ``busy`` when the time is up."""
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise busy
        await asyncio.sleep(min(self._delay, left))
        self._delay = min(self._delay * 2, self._max_s)


def holder(token: str) -> str:
    """The lease holder name of an in-process turn (workers hold leases by worker id)."""
    return f"agent:{token}"


async def reserve(
    proto: HeldStore, cid: str, token: str, *, lease_ms: int, spent_ttl_ms: int | None
) -> int:
    """Take the conversation's lease for the turn ``token`` and return its fence.
    ``spent_ttl_ms``: the token belongs to a continuation being resumed (spent here).

    Raises:
        ConversationBusyError: a turn is queued, running or awaiting approval.
        ConvoqError: a resumed continuation already ran or was discarded, or its parked
            lease expired or was cleared.
    """
    keys = [proto.keys.meta(cid), proto.keys.inbox(cid), proto.keys.lease(cid)]
    keys.append(proto.keys.spent(cid, token))
    args: list[Any] = [holder(token), lease_ms, "" if spent_ttl_ms is None else spent_ttl_ms]
    reply = ReserveReply.parse(await proto.scripts.run("reserve", keys, args))
    if reply.refusal is not None:
        raise proto.refusal(reply.refusal, cid, None)
    return reply.fence


async def unreserve(
    proto: HeldStore,
    cid: str,
    token: str,
    *,
    park_ms: int | None = None,
    spent_ttl_ms: int | None = None,
) -> None:
    """Free the lease of the turn ``token`` (a no-op if it is not its holder), or with
    ``park_ms`` keep it parked that long while its tool calls await approval.
    ``spent_ttl_ms``: mark the token spent (a discarded continuation)."""
    mode, ttl = ("park", park_ms) if park_ms is not None else ("free", spent_ttl_ms)
    keys = [proto.keys.lease(cid), proto.keys.spent(cid, token)]
    args = [holder(token), mode, ttl or ""]
    reply = Outcome.parse("unreserve", await proto.scripts.run("unreserve", keys, args))
    if reply.refusal is not None:
        raise proto.refusal(reply.refusal, cid, None)


async def commit_held(
    proto: HeldStore, cid: str, token: str, fence: int, messages: list[Message]
) -> None:
    """Append the turn under the lease ``fence`` and free the lease, exactly once.

    Raises:
        StaleFenceError: the lease moved on (it expired while this process stalled); the
            turn was not stored.
        NotDurableError: stored, but fewer than ``min_replicas_acked`` replicas confirmed
            it in time (committing it again stores nothing and waits again).
    """
    await append_history(
        proto.scripts, proto.keys, cid, messages, proto.limits, append_id=token, fence=fence
    )
    if proto.acks.enabled:
        # Acknowledged like a worker's commit (min_replicas_acked): once the replicas have
        # everything this primary held after the append (see convoq.redis._durable).
        stored = ("EXISTS", proto.keys.meta(cid))
        await replicated(proto.redis, proto.acks, proto.keys.acked(cid), stored)

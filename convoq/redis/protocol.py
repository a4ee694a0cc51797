"""The turn protocol: a typed async function per Lua script.

A conversation's turns wait in its inbox; the worker holding the conversation's *lease*
runs the head. Leases carry a *fence* token that strictly increases per conversation, and
every write that ends or journals a turn checks it inside Redis, so a worker whose lease
was taken over cannot append anything.

Hand-off, one round trip per turn while a conversation is busy: whatever hands out a turn
(``acquire``, or a hand-off) also *peeks* at the turn queued right behind it
(:attr:`Acquired.next_turn_id`). The runner passes that id back to ``commit`` or ``fail``
(``next_turn_id``), and with it that turn's keys, since every key a script touches must
arrive in ``KEYS`` (Redis Cluster). Once the ended turn left the inbox, the script keeps
the lease (same fence) and, when the new head is the expected turn, hands it out right
there as ``acquire`` would (attempts, approval expiry, its history window, its saved
state, the next peek): commit and the next acquire in one script call. When the head is
another turn (the expected one was cancelled meanwhile, or none was expected because the
next turn arrived later) the script returns its id and :meth:`TurnProtocol.commit` runs
``acquire`` for it with the fence as proof of ownership: two calls, as before. A new fence
is taken only when a lease is acquired afresh.

Events a runner emits wait in a :class:`TurnEvents` buffer and go to the stream inside its
next fenced write (checkpoint, commit, fail, park), before that write's own events, so a
turn's stream keeps their order and "done" comes last; a checkpoint answers whether a
cancel was requested, so the runner reads nothing between steps.

Where each verb lives (the class is assembled from these, over :mod:`convoq.redis._base`):

- here: ``submit`` (queue a turn; limits in :mod:`convoq.redis._admission`) and ``usage``;
- :mod:`convoq.redis._taking`: ``acquire``/``take``, ``renew``, ``release`` and the
  hand-off of the next turn;
- :mod:`convoq.redis._ending`: ``checkpoint``, ``commit``, ``fail``, ``park``;
- :mod:`convoq.redis._control`: approvals (``decide``, ``discard``), ``cancel``, ``clear``,
  sweeping and the agents' registry;
- :mod:`convoq.redis._events`: event streams and turn records;
  :mod:`convoq.redis._retention`: pruning old turns;
- :mod:`convoq.redis._replies`: every script reply parsed, and the refusal table.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from convoq.errors import (
    ConvoqError,
)
from convoq.messages import Message, check_user_message
from convoq.redis._admission import AdmissionMixin
from convoq.redis._codec import (
    check_message_limits,
)
from convoq.redis._control import ControlMixin
from convoq.redis._ending import EndingMixin
from convoq.redis._events import EventsMixin, TurnEvents
from convoq.redis._records import (
    Acquired,
    Handoff,
    ParkedTurn,
    SubmitResult,
    Taking,
    TurnEnding,
    TurnRecord,
    TurnStatus,
)
from convoq.redis._retention import RetentionMixin
from convoq.usage import COUNTER_FIELDS, Usage, counters_to_usage

__all__ = [
    "Acquired",
    "Handoff",
    "ParkedTurn",
    "SubmitResult",
    "Taking",
    "TurnEnding",
    "TurnEvents",
    "TurnProtocol",
    "TurnRecord",
    "TurnStatus",
]


class TurnProtocol(EndingMixin, ControlMixin, EventsMixin, RetentionMixin, AdmissionMixin):
    """Queued turns of conversations in Redis (async; see the module docstring).

    Args:
        redis: a ``redis.asyncio.Redis`` with ``decode_responses=False``.
        keys: the key schema (its prefix).
        max_attachment_bytes: largest attachment accepted.
        max_turn_bytes: largest turn (messages plus attachments) accepted.
        turn_ttl_s: how long finished turn records and their events are kept.
        events_maxlen: approximate cap of each turn's event stream.
        conversation_ttl_s: idle TTL of each conversation (None: kept until deleted).
        queue_limits: how many turns may wait (:class:`~convoq.limits.QueueLimits`).
        min_replicas_acked: replicas that must confirm a submit, commit, fail or park
            before it returns; fewer within ``replica_ack_timeout_ms``: NotDurableError
            (the write stays applied; sending it again is a no-op that waits again).
        replica_ack_timeout_ms: how long such a write waits for its replicas.
        fast_paths: send hot script calls without redis-py's machinery (None:
            ``CONVOQ_FAST_PATHS``; see :class:`~convoq.redis.scripts.Scripts`).

    Entry points build it with :meth:`from_settings`, from the settings they resolved.
    """

    async def submit(
        self,
        cid: str,
        turn_id: str,
        *,
        agent: str,
        message: Message,
        options: dict[str, Any],
        idempotency_key: str | None = None,
        if_busy: Literal["queue", "reject"] = "queue",
        kick: tuple[str, str] | None = None,
    ) -> SubmitResult:
        """Queue a turn. Raises ConversationBusyError for ``if_busy="reject"`` on a busy
        conversation, QueueFullError over a limit of :attr:`queue_limits` (nothing
        stored either way).

        ``kick``: ``(queue list, message)``, for a broker that is this very (non-cluster)
        Redis: when the conversation was idle the script pushes ``message`` onto that list
        itself, in the same call (:attr:`SubmitResult.kicked`)."""
        keys = [self.keys.meta(cid), self.keys.inbox(cid), self.keys.turn(cid, turn_id)]
        keys += [self.keys.events(cid, turn_id), self.keys.lease(cid)]
        if idempotency_key is not None:
            keys.append(self.keys.idem(cid, idempotency_key))
        if kick is not None:
            keys.append(kick[0])
        check_user_message(message)
        if not isinstance(agent, str) or not agent:
            raise ConvoqError("agent must be the non-empty name of an agent profile")
        if if_busy not in ("queue", "reject"):
            raise ConvoqError(f"if_busy must be 'queue' or 'reject', not {if_busy!r}")
        raw = check_message_limits(message, self.limits)
        args: list[Any] = [turn_id, agent, raw, self.json_arg(options, "options"), if_busy]
        args += [self.turn_ttl_ms, self.events_maxlen]
        queued: dict[str, Any] = {"status": "queued"}
        if options.get("metadata"):
            queued["metadata"] = options["metadata"]
        return await self.admitted_submit(
            cid, turn_id, agent, keys, args, kick=None if kick is None else kick[1],
            queued_event=json.dumps(queued, separators=(",", ":")),
        )  # fmt: skip

    async def usage(self, cid: str) -> Usage:
        """What the conversation's committed turns reported, summed: one read of its meta
        hash, whatever the history's length (commit adds each turn's usage there)."""
        fields = list(COUNTER_FIELDS.values())
        values = await self.redis.hmget(self.keys.meta(cid), fields)
        return counters_to_usage(dict(zip(fields, values, strict=True)))

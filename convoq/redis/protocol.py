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

Where each verb lives (the class is assembled here from these, over
:mod:`convoq.redis._base`, which holds the client, the scripts and the limits):

- :mod:`convoq.redis._submitting`: ``submit`` and its queued-turn limits (admission,
  uncounting ended turns, ``reconcile_admitted``);
- :mod:`convoq.redis._retrying`: ``retry`` (a failed turn queued again as the same turn);
- :mod:`convoq.redis._taking`: ``acquire``/``take``, ``renew``, ``release``,
  ``report_cut_off`` and the hand-off of the next turn;
- :mod:`convoq.redis._ending`: ``checkpoint``, ``commit``, ``fail``, ``park``;
- :mod:`convoq.redis._holding`: in-process turns under the same lease (``reserve``,
  ``unreserve``, ``commit_held``: functions over the protocol, for Redis memory);
- :mod:`convoq.redis._approvals`: ``decide``, ``discard`` (``discard_turn``),
  ``parked_turns``;
- :mod:`convoq.redis._world`: ``send_signal`` (``send_signal_routed``), and what
  ``park`` stores of the calls that wait for the world (:mod:`convoq.waits`);
- :mod:`convoq.redis._cancelling`: ``cancel`` (``cancel_turn``), ``is_cancel_requested``,
  ``clear``;
- :mod:`convoq.redis._reading`: ``history``, ``window``, ``usage``;
- :mod:`convoq.redis._events`: turn records and event streams (``get_turn``,
  ``read_events``, ``emit``);
- :mod:`convoq.redis._retention`: ``touch`` (the idle TTL), ``prune``;
- :mod:`convoq.redis._popping`: ``pop`` (the newest message, for memory and sessions);
- :mod:`convoq.redis._scheduling`: ``schedule``, ``fire_due``, ``scheduled_turns`` and
  the timer index (scheduled turns on durable timers);
- :mod:`convoq.redis._sweeping`: ``sweep_candidates``, ``sweep_scan``, ``mark_swept``
  (the sweeper's backoff);
- :mod:`convoq.redis._transferring`: ``transfer`` (a handoff), ``head_agent``,
  ``turn_agent``;
- :mod:`convoq.redis._registry`: ``registered_agents``/``workers``/``prefixes``,
  ``check_epoch``;
- :mod:`convoq.redis._replies`: every script reply parsed into a record;
  :mod:`convoq.redis._refusals`: the one table of refusals (status -> error).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convoq.redis._approvals import ApprovalsMixin
from convoq.redis._cancelling import CancellingMixin
from convoq.redis._ending import EndingMixin
from convoq.redis._events import EventsMixin, TurnEvents
from convoq.redis._popping import PoppingMixin
from convoq.redis._reading import ReadingMixin
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
from convoq.redis._registry import RegistryMixin
from convoq.redis._retention import RetentionMixin
from convoq.redis._retrying import Retried, RetryingMixin
from convoq.redis._scheduling import SchedulingMixin
from convoq.redis._submitting import SubmittingMixin
from convoq.redis._sweeping import SweepingMixin
from convoq.redis._transferring import TransferringMixin
from convoq.redis._world import Signalled, SignalsMixin

if TYPE_CHECKING:
    from convoq.redis.roles import ClientStore, MemoryStore, WorkerStore

__all__ = [
    "Acquired",
    "Handoff",
    "ParkedTurn",
    "Retried",
    "Signalled",
    "SubmitResult",
    "Taking",
    "TurnEnding",
    "TurnEvents",
    "TurnProtocol",
    "TurnRecord",
    "TurnStatus",
]


class TurnProtocol(
    RetryingMixin,  # over SubmittingMixin
    SubmittingMixin,
    EndingMixin,  # over TakingMixin
    ApprovalsMixin,
    CancellingMixin,
    ReadingMixin,
    EventsMixin,
    PoppingMixin,  # over RetentionMixin
    RetentionMixin,
    SweepingMixin,
    SchedulingMixin,
    RegistryMixin,
    TransferringMixin,
    SignalsMixin,
):
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


if TYPE_CHECKING:
    # The protocol plays every role its callers are typed against (convoq.redis.roles);
    # mypy fails here when a role asks for something the protocol no longer has. The
    # narrower roles are parts of these three (HeldStore of MemoryStore, the runner's and
    # the sweeper's of WorkerStore).

    def _plays_every_role(p: TurnProtocol) -> tuple[WorkerStore, ClientStore, MemoryStore]:
        return p, p, p

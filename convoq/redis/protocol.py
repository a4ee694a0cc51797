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

The class is assembled from parts: :mod:`convoq.redis._taking` (acquire and the
hand-off), :mod:`convoq.redis._control` (approvals, cancel, clear, sweeping, the
registry) and :mod:`convoq.redis._events` (events and turn records), over
:mod:`convoq.redis._base`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from convoq.errors import (
    ConvoqError,
    InvalidMessageError,
    NotInboxHeadError,
    ProtocolError,
)
from convoq.messages import Message, MessageRole, check_user_message
from convoq.redis._admission import AdmissionMixin
from convoq.redis._codec import (
    Encoded,
    check_message_limits,
    check_turn_size,
    counters_arg,
    encode_element,
    usage_of,
)
from convoq.redis._control import ControlMixin
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
from convoq.redis._replies import EndReply, cancel_requested, stale_fence
from convoq.redis._retention import RetentionMixin
from convoq.redis._taking import TakingMixin
from convoq.turn_state import TurnEvent, TurnState
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


class TurnProtocol(TakingMixin, ControlMixin, EventsMixin, RetentionMixin, AdmissionMixin):
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

    async def renew(
        self, cid: str, *, fence: int, lease_ms: int, turn_id: str | None = None
    ) -> bool:
        """Extend the lease; StaleFenceError if it moved on. With ``turn_id`` (the turn run
        under the lease) only while that turn is still the running inbox head, else
        NotInboxHeadError: a renewal that arrives after the run ended extends nothing.
        Returns True when a cancel was requested for ``turn_id``."""
        keys = [self.keys.lease(cid)]
        args: list[Any] = [fence, lease_ms]
        if turn_id is not None:
            keys += [self.keys.inbox(cid), self.keys.turn(cid, turn_id)]
            args.append(turn_id)
        reply = await self.scripts.run("renew", keys, args)
        if reply[0] == "ENDED":
            raise NotInboxHeadError(
                f"turn {turn_id!r} of conversation {cid!r} is no longer running under this"
                " lease; its run has ended",
                conversation_id=cid,
                turn_id=turn_id,
            )
        if reply[0] != "OK":
            raise stale_fence(cid, turn_id, fence)
        return cancel_requested(reply)

    async def release(self, cid: str, turn_id: str, *, fence: int) -> bool:
        """Hand the conversation back unfinished (a worker shutting down): free the lease
        held with ``fence`` so any worker takes ``turn_id`` at once (not counted as an
        attempt; its journal stays). False when the lease had moved on already."""
        keys = [self.keys.lease(cid), self.keys.inbox(cid), self.keys.turn(cid, turn_id)]
        reply = await self.scripts.run("release", keys, [fence, turn_id])
        return bool(reply[0] == "OK")

    async def checkpoint(
        self,
        cid: str,
        turn_id: str,
        *,
        fence: int,
        state: TurnState,
        events: Sequence[TurnEvent] = (),
    ) -> bool:
        """Journal the turn so far (a rerun starts from here), after appending ``events`` to
        its stream. Fenced like commit. Returns True when a cancel was requested: the
        runner stops before its next step."""
        keys = [self.keys.inbox(cid), self.keys.lease(cid), self.keys.turn(cid, turn_id)]
        keys += [self.keys.journal(cid, turn_id), self.keys.events(cid, turn_id)]
        args = [turn_id, fence, state.model_dump_json(), self.turn_ttl_ms, self.events_maxlen]
        reply = await self.scripts.run("checkpoint", keys, [*args, *self.event_args(events)])
        if reply[0] != "OK":
            raise self.refusal(reply, cid, turn_id, fence)
        return cancel_requested(reply)

    def _ending_keys(self, cid: str, turn_id: str) -> list[str]:
        return [self.keys.inbox(cid), self.keys.lease(cid), *self.keys.turn_keys(cid, turn_id)]

    async def commit(
        self,
        cid: str,
        turn_id: str,
        messages: list[Message],
        ending: TurnEnding,
        *,
        stop_if_cancelled: bool = False,
        output: Any = None,
        expired: bool = False,
    ) -> Acquired | None:
        """The turn :meth:`commit_and_hand_off` hands out next (None: none), for a caller
        that owes nothing to turns failed on the way (they are failed all the same)."""
        handoff = await self.commit_and_hand_off(
            cid,
            turn_id,
            messages,
            ending,
            stop_if_cancelled=stop_if_cancelled,
            output=output,
            expired=expired,
        )
        return handoff.turn

    async def commit_and_hand_off(
        self,
        cid: str,
        turn_id: str,
        messages: list[Message],
        ending: TurnEnding,
        *,
        stop_if_cancelled: bool = False,
        output: Any = None,
        expired: bool = False,
    ) -> Handoff:
        """Append the whole turn (user message first) exactly once, mark it succeeded (or,
        with ``expired``, expired: its approval ran out and its tool results say so) with
        ``result = {"text", "messages"}`` (``messages``: what the turn added after the user
        message), append ``ending.events`` and then "done" to its stream, and hand out the
        next queued turn under the same fence, or none with the lease freed. Turns failed
        on the way to the next one come back in :attr:`Handoff.failed` (as :meth:`take`).
        When ``ending.next_turn_id`` is the next turn, it comes back in this same round trip.
        ``output``: a turn with an output type, its validated answer (JSON), kept in the
        result as ``"output"``.

        Raises:
            StaleFenceError, NotInboxHeadError, TurnAlreadyAppliedError (a replay: nothing
            was written; treat it as success); TurnCancelledError with
            ``stop_if_cancelled`` when a cancel was requested (nothing was written: fail the
            turn as cancelled).
        """
        keys, args = self.commit_call(
            cid,
            turn_id,
            messages,
            ending,
            stop_if_cancelled=stop_if_cancelled,
            output=output,
            expired=expired,
        )
        reply = await self.run_acked("commit", cid, keys, args)
        if reply[0] != "OK":
            raise self.refusal(reply, cid, turn_id, ending.fence)
        return await self.handed(cid, EndReply.parse(reply), ending)

    def commit_call(
        self,
        cid: str,
        turn_id: str,
        messages: list[Message],
        ending: TurnEnding,
        *,
        stop_if_cancelled: bool = False,
        output: Any = None,
        expired: bool = False,
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of the commit script (checked and encoded, nothing sent)."""
        element, result, counters, encoded = self._stored_turn(messages, output, expired)
        following = self.next_turn_keys(cid, ending.expected_next)
        keys = [self.keys.meta(cid), self.keys.turns(cid), self.keys.blobs(cid)]
        keys += self._ending_keys(cid, turn_id)
        keys += [self.keys.lead(cid), *following] if following else []
        args = [turn_id, ending.fence, element, result, "1" if stop_if_cancelled else "0"]
        args += ["expired" if expired else "succeeded"]
        args += [ending.expected_next or "", *self.take_args(ending.taking())]
        args.append(counters)
        return keys, [*args, *self.event_args(ending.events), *encoded.blob_args()]

    def _stored_turn(
        self, messages: list[Message], output: Any = None, expired: bool = False
    ) -> tuple[bytes, str, str, Encoded]:
        """The history element of a committed turn, its result JSON, the usage counters to
        add to the conversation's and its blobs. An expired turn ends with tool results,
        not an answer: its text is empty."""
        if not messages or messages[0].role != MessageRole.USER:
            raise InvalidMessageError("a committed turn starts with its user message", rule="turn")
        encoded = Encoded()
        element = encode_element(messages, self.limits, encoded)
        check_turn_size(encoded, self.limits)
        final = messages[-1]
        usage = usage_of(messages[1:])
        result: dict[str, Any] = {
            "text": "" if expired else final.text,
            "messages": [m.model_dump(mode="json") for m in messages[1:]],
            "usage": usage.model_dump(),
            "finish_reason": final.finish_reason,
        }
        if final.refusal is not None:
            result["refusal"] = final.refusal
        if output is not None:
            result["output"] = output
        return element, self.json_arg(result, "result"), counters_arg(usage), encoded

    async def usage(self, cid: str) -> Usage:
        """What the conversation's committed turns reported, summed: one read of its meta
        hash, whatever the history's length (commit adds each turn's usage there)."""
        fields = list(COUNTER_FIELDS.values())
        values = await self.redis.hmget(self.keys.meta(cid), fields)
        return counters_to_usage(dict(zip(fields, values, strict=True)))

    async def fail(
        self, cid: str, turn_id: str, error: dict[str, Any], ending: TurnEnding
    ) -> Acquired | None:
        """The turn :meth:`fail_and_hand_off` hands out next (None: none)."""
        return (await self.fail_and_hand_off(cid, turn_id, error, ending)).turn

    async def fail_and_hand_off(
        self, cid: str, turn_id: str, error: dict[str, Any], ending: TurnEnding
    ) -> Handoff:
        """End the turn as failed (``error`` = ConvoqError.to_data()), storing nothing; an
        error of type TurnCancelledError ends it as cancelled. ``ending.events`` go to its
        stream before "done". Guards and hand-off as :meth:`commit_and_hand_off`."""
        status = "cancelled" if error.get("type") == "TurnCancelledError" else "failed"
        following = self.next_turn_keys(cid, ending.expected_next)
        keys = self._ending_keys(cid, turn_id)
        keys += [*self.keys.history_keys(cid), *following] if following else []
        args = [turn_id, ending.fence, self.json_arg(error, "error"), status]
        args += [ending.expected_next or "", *self.take_args(ending.taking())]
        reply = await self.run_acked("fail", cid, keys, [*args, *self.event_args(ending.events)])
        if reply[0] != "OK":
            raise self.refusal(reply, cid, turn_id, ending.fence)
        return await self.handed(cid, EndReply.parse(reply), ending)

    async def park(
        self,
        cid: str,
        turn_id: str,
        *,
        fence: int,
        state: TurnState,
        approval_ttl_ms: int,
        events: Sequence[TurnEvent] = (),
    ) -> None:
        """Store the continuation and wait for decisions on ``state``'s undecided calls; the
        conversation stays reserved until they are decided or the approval expires.
        ``events`` go to its stream first. A replay for a turn already parked with this
        fence is a no-op."""
        waiting = state.undecided
        if not waiting:
            raise ProtocolError("park needs a state with tool calls waiting for a decision")
        pending = self.json_arg([call.id for call in waiting], "pending")
        result = {"pending_approvals": [call.model_dump(mode="json") for call in waiting]}
        args = [turn_id, fence, state.model_dump_json(), pending, self.json_arg(result, "result")]
        args += [approval_ttl_ms, self.events_maxlen, *self.event_args(events)]
        reply = await self.run_acked("park", cid, self._ending_keys(cid, turn_id), args)
        if reply[0] not in ("OK", "PARKED"):
            raise self.refusal(reply, cid, turn_id, fence)

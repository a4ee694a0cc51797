"""The turn protocol: a typed async function per Lua script.

A conversation's turns wait in its inbox; the worker holding the conversation's *lease*
runs the head. Leases carry a *fence* token that strictly increases per conversation, and
every write that ends or journals a turn checks it inside Redis, so a worker whose lease
was taken over cannot append anything.

Commit/fail hand-off: ending a turn keeps the lease (same fence) when more turns wait and
returns the next turn id; :meth:`TurnProtocol.commit` then runs ``acquire`` for that id with
the fence as proof of ownership. Two script calls per turn, because every key a script
touches must arrive in ``KEYS`` (Redis Cluster) and the next turn's keys are only known once
the inbox was popped. A new fence is taken only when a lease is acquired afresh.

Events a runner emits wait in a :class:`TurnEvents` buffer and go to the stream inside its
next fenced write (checkpoint, commit, fail, park), before that write's own events, so a
turn's stream keeps their order and "done" comes last; a checkpoint answers whether a
cancel was requested, so the runner reads nothing between steps.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

from convoq.engine import TurnEvent, TurnState
from convoq.errors import (
    ConvoqError,
    CorruptDataError,
    InvalidMessageError,
    ProtocolError,
    StaleFenceError,
    UnsupportedFormatVersionError,
)
from convoq.ids import check_conversation_id, check_turn_id
from convoq.messages import Message, MessageRole, check_user_message
from convoq.redis._base import approval_expired_error, max_attempts_error, text
from convoq.redis._codec import Encoded, check_message_limits, check_turn_size, encode_element
from convoq.redis._control import ControlMixin, TurnEvents
from convoq.redis._history import decode_window
from convoq.redis._records import (
    Acquired,
    SubmitResult,
    Taking,
    TurnRecord,
    TurnStatus,
    decode_record,
    decode_state,
    fields_to_dict,
)

__all__ = ["Acquired", "SubmitResult", "TurnEvents", "TurnProtocol", "TurnRecord", "TurnStatus"]

log = logging.getLogger(__name__)

# Each retry of acquire follows a turn that was dropped, failed or changed meanwhile.
_MAX_RETRIES = 1000


def _valid_turn_id(value: str) -> bool:
    """Whether ``value`` may name a turn (and so a key)."""
    try:
        check_turn_id(value)
    except ConvoqError:
        return False
    return True


class TurnProtocol(ControlMixin):
    """Queued turns of conversations in Redis (async; see the module docstring).

    Args:
        redis: a ``redis.asyncio.Redis`` with ``decode_responses=False``.
        keys: the key schema (its prefix).
        max_attachment_bytes: largest attachment accepted.
        max_turn_bytes: largest turn (messages plus attachments) accepted.
        turn_ttl_s: how long finished turn records and their events are kept.
        events_maxlen: approximate cap of each turn's event stream.
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
    ) -> SubmitResult:
        """Queue a turn. Raises ConversationBusyError for ``if_busy="reject"`` on a busy
        conversation (nothing stored)."""
        keys = [self.keys.meta(cid), self.keys.inbox(cid), self.keys.turn(cid, turn_id)]
        keys.append(self.keys.events(cid, turn_id))
        if idempotency_key is not None:
            keys.append(self.keys.idem(cid, idempotency_key))
        check_user_message(message)
        if not isinstance(agent, str) or not agent:
            raise ConvoqError("agent must be the non-empty name of an agent profile")
        if if_busy not in ("queue", "reject"):
            raise ConvoqError(f"if_busy must be 'queue' or 'reject', not {if_busy!r}")
        raw = check_message_limits(message, self.limits)
        args = [turn_id, agent, raw, self.json_arg(options, "options"), if_busy]
        reply = await self.scripts.run(
            "submit", keys, [*args, self.turn_ttl_ms, self.events_maxlen]
        )
        if reply[0] == "OK":
            return SubmitResult(turn_id, int(reply[1]), duplicate=False)
        if reply[0] == "DUP":
            return SubmitResult(reply[1].decode(), int(reply[2]), duplicate=True)
        raise self.refusal(reply, cid, turn_id)

    async def acquire(
        self,
        cid: str,
        *,
        worker_id: str,
        lease_ms: int,
        window: int = 0,
        max_attempts: int = 5,
        failed: list[str] | None = None,
        head: str | None = None,
    ) -> Acquired | None:
        """Take the conversation's lease (a new fence) and its head turn with the history
        window. None: nothing queued, the lease is live elsewhere, or the head is parked
        undecided. Heads over ``max_attempts`` or with an expired approval are failed on
        the way and the next head is taken; their ids are appended to ``failed`` (they
        are finished turns whose callbacks are owed). ``head``: the turn id the caller
        believes heads the inbox, which saves reading it first (the script checks it and
        goes on with the real head if it is not)."""
        check_conversation_id(cid)
        first: bytes | str | None = head
        if head is None or not _valid_turn_id(head):
            first = await self.redis.lindex(self.keys.inbox(cid), 0)
        taking = Taking(worker_id, lease_ms, window, max_attempts, 0, failed)
        return await self._take(cid, first, taking)

    async def _take(self, cid: str, head: bytes | str | None, t: Taking) -> Acquired | None:
        errors = [
            self.json_arg(max_attempts_error(t.max_attempts), "error"),
            self.json_arg(approval_expired_error(), "error"),
        ]
        for _ in range(_MAX_RETRIES):
            if head is None:
                return None
            tid = self._head_id(cid, head)
            keys = [*self.keys.history_keys(cid), self.keys.inbox(cid), self.keys.lease(cid)]
            keys += self.keys.turn_keys(cid, tid)
            args = [tid, t.worker_id, t.lease_ms, t.window, t.max_attempts, t.fence]
            args += [self.turn_ttl_ms, self.events_maxlen, *errors]
            reply = await self.scripts.run("acquire", keys, args)
            if reply[0] == "OK":
                return self._acquired(cid, tid, reply, t.window)
            t.note_failed(reply)
            if reply[0] in ("EMPTY", "BUSY"):
                return None
            if reply[0] != "RETRY":
                raise self.refusal(reply, cid, tid)
            head = reply[1]
        return None  # the inbox kept changing under us; the sweeper kicks it again

    def _head_id(self, cid: str, head: bytes | str) -> str:
        """The id of an inbox entry (CorruptDataError naming the inbox if it is no id)."""
        try:
            return check_turn_id(text(head))
        except ConvoqError as exc:
            raise self.refusal(["CORRUPT", self.keys.inbox(cid)], cid, "?") from exc

    def _acquired(self, cid: str, tid: str, reply: list[Any], window: int) -> Acquired:
        fields = fields_to_dict(reply[2])
        key = self.keys.turn(cid, tid)
        kind = reply[3].decode() if isinstance(reply[3], bytes) else None
        return Acquired(
            conversation_id=cid,
            fence=int(reply[1]),
            turn=decode_record(cid, tid, fields, key),
            history=decode_window(self.keys, cid, reply[5], reply[6], reply[7], window),
            state=decode_state(kind, reply[4], fields, key),
        )

    async def renew(self, cid: str, *, fence: int, lease_ms: int) -> None:
        """Extend the lease; StaleFenceError if it moved on."""
        reply = await self.scripts.run("renew", [self.keys.lease(cid)], [fence, lease_ms])
        if reply[0] != "OK":
            raise StaleFenceError(
                f"the lease on conversation {cid!r} moved on (fence {fence} is no longer"
                " current); stop running its turn: another worker owns it now",
                conversation_id=cid,
                fence=fence,
            )

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
        return bool(reply[1] == b"1")

    def _ending_keys(self, cid: str, turn_id: str) -> list[str]:
        return [self.keys.inbox(cid), self.keys.lease(cid), *self.keys.turn_keys(cid, turn_id)]

    async def commit(
        self,
        cid: str,
        turn_id: str,
        *,
        fence: int,
        messages: list[Message],
        lease_ms: int,
        window: int = 0,
        max_attempts: int = 5,
        failed: list[str] | None = None,
        events: Sequence[TurnEvent] = (),
        stop_if_cancelled: bool = False,
    ) -> Acquired | None:
        """Append the whole turn (user message first) exactly once, mark it succeeded with
        ``result = {"text", "messages"}`` (``messages``: what the turn added after the user
        message), append ``events`` and then "done" to its stream, and return the next
        queued turn under the same fence, or None with the lease freed. Turns failed on the
        way to the next one are appended to ``failed`` (as :meth:`acquire`).

        Raises:
            StaleFenceError, NotInboxHeadError, TurnAlreadyAppliedError (a replay: nothing
            was written; treat it as success); TurnCancelledError with
            ``stop_if_cancelled`` when a cancel was requested (nothing was written: fail the
            turn as cancelled).
        """
        keys, args = self.commit_call(
            cid,
            turn_id,
            fence=fence,
            messages=messages,
            lease_ms=lease_ms,
            events=events,
            stop_if_cancelled=stop_if_cancelled,
        )
        reply = await self.scripts.run("commit", keys, args)
        if reply[0] != "OK":
            raise self.refusal(reply, cid, turn_id, fence)
        taking = Taking("", lease_ms, window, max_attempts, fence, failed)
        return await self._hand_off(cid, reply[1], taking)

    def commit_call(
        self,
        cid: str,
        turn_id: str,
        *,
        fence: int,
        messages: list[Message],
        lease_ms: int,
        events: Sequence[TurnEvent] = (),
        stop_if_cancelled: bool = False,
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of the commit script (checked and encoded, nothing sent)."""
        if not messages or messages[0].role != MessageRole.USER:
            raise InvalidMessageError("a committed turn starts with its user message", rule="turn")
        encoded = Encoded()
        element = encode_element(messages, self.limits, encoded)
        check_turn_size(encoded, self.limits)
        result = {
            "text": messages[-1].text,
            "messages": [m.model_dump(mode="json") for m in messages[1:]],
        }
        keys = [self.keys.meta(cid), self.keys.turns(cid), self.keys.blobs(cid)]
        keys += self._ending_keys(cid, turn_id)
        args = [turn_id, fence, element, self.json_arg(result, "result"), self.turn_ttl_ms]
        args += [self.events_maxlen, lease_ms, "1" if stop_if_cancelled else "0"]
        return keys, [*args, *self.event_args(events), *encoded.blob_args()]

    async def fail(
        self,
        cid: str,
        turn_id: str,
        *,
        fence: int,
        error: dict[str, Any],
        lease_ms: int,
        window: int = 0,
        max_attempts: int = 5,
        failed: list[str] | None = None,
        events: Sequence[TurnEvent] = (),
    ) -> Acquired | None:
        """End the turn as failed (``error`` = ConvoqError.to_data()), storing nothing; an
        error of type TurnCancelledError ends it as cancelled. ``events`` go to its stream
        before "done". Guards and hand-off as :meth:`commit`."""
        status = "cancelled" if error.get("type") == "TurnCancelledError" else "failed"
        args = [turn_id, fence, self.json_arg(error, "error"), status, self.turn_ttl_ms]
        args += [self.events_maxlen, lease_ms, *self.event_args(events)]
        reply = await self.scripts.run("fail", self._ending_keys(cid, turn_id), args)
        if reply[0] != "OK":
            raise self.refusal(reply, cid, turn_id, fence)
        taking = Taking("", lease_ms, window, max_attempts, fence, failed)
        return await self._hand_off(cid, reply[1], taking)

    async def _hand_off(self, cid: str, head: bytes | None, taking: Taking) -> Acquired | None:
        """The next turn under the same lease. The turn before it is already stored, so a
        next turn that cannot be loaded is left to the next acquire (after the lease
        expires) to report, instead of making this commit look failed."""
        try:
            return await self._take(cid, head, taking)
        except (CorruptDataError, UnsupportedFormatVersionError) as exc:
            log.error("cannot hand conversation %s its next turn: %s", cid, exc.message)
            return None

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
        reply = await self.scripts.run("park", self._ending_keys(cid, turn_id), args)
        if reply[0] not in ("OK", "PARKED"):
            raise self.refusal(reply, cid, turn_id, fence)

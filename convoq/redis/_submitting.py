"""Submitting a turn: ``submit``, and the limits on queued turns it enforces.

``submit`` checks the turn (its message, agent and size) before anything is sent, then
queues it in one script call: the turn record, its first event, its place in the inbox
and, for a broker on this very Redis, the kick that wakes a worker.

Admission. Per conversation the limit is exact: the ``submit`` script compares the inbox's length
(the running turn included) with it before it writes anything.

Per agent and in all, the turns waiting span conversations, hence Cluster slots, and no
script may touch two slots. So those counts live in their own slot (the ``{~queued}``
keys of :class:`~convoq.redis.keys.KeySchema`): ``admit`` checks both limits and counts
the turn (atomically, in one script), then the conversation's ``submit`` script runs; if
that refuses or fails, ``unadmit`` takes the count back. A turn is uncounted when it
ends: the worker does it after commit or fail (and for turns the sweeper expires), a
client after a cancel or discard; so a place frees a moment *after* the turn's result is
visible, and a client that submits the instant it saw a result may still be refused.
Both scripts are keyed by the member ``"cid tid"``, so a replay or a second uncount
changes nothing.

Exactness: the limits are never exceeded (check and count are one script). A count can
linger after its turn ended -- a worker killed between its commit and its uncount, a
turn ended by ``clear`` or an expiry, a client dying between admit and submit -- which
makes the limit stricter, never looser. The sweeper reconciles: each period it looks at
up to ``batch`` counted turns older than ``grace_ms`` (walking the whole set over
successive periods with a stored HSCAN cursor) and uncounts those whose record is final
or gone. A lingering count lives at most ``ceil(counted / batch)`` sweep periods after
its grace. What is counted: turns admitted and not yet ended (queued, running or parked
for approval).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from convoq.errors import ConvoqError, InvalidConversationIdError, NotDurableError, QueueFullError
from convoq.ids import check_turn_id, from_key_part, key_part
from convoq.messages import Message, check_user_message
from convoq.redis._base import ProtocolBase
from convoq.redis._codec import check_message_limits, text
from convoq.redis._records import FINAL_STATUSES, SubmitResult
from convoq.redis._replies import AdmitReply, CountReply, SubmitReply
from convoq.redis._texting import BusyCall, HeadMoved, IfBusy, busy_submit, check_busy_args

log = logging.getLogger("convoq.redis")


class SubmittingMixin(ProtocolBase):
    """``submit``, its queued-turn limits, the uncount of ended turns, reconciling."""

    async def submit(
        self,
        cid: str,
        turn_id: str,
        *,
        agent: str,
        message: Message,
        options: dict[str, Any],
        idempotency_key: str | None = None,
        if_busy: IfBusy = "queue",
        kick: tuple[str, str] | None = None,
        merge_key: str | None = None,
    ) -> SubmitResult:
        """Queue a turn. Raises ConversationBusyError for ``if_busy="reject"`` on a busy
        conversation, QueueFullError over a limit of :attr:`queue_limits` (nothing
        stored either way). ``if_busy`` "interrupt" / "rollback" stop the inbox head,
        "merge" joins a queued turn submitted with "merge" under the same ``merge_key``
        (:mod:`convoq.redis._texting`).

        ``kick``: ``(queue list, message)``, for a broker that is this very (non-cluster)
        Redis: when the conversation was idle the script pushes ``message`` onto that list
        itself, in the same call (:attr:`SubmitResult.kicked`)."""
        keys = [self.keys.meta(cid), self.keys.inbox(cid), self.keys.turn(cid, turn_id)]
        keys += [self.keys.events(cid, turn_id), self.keys.lease(cid)]
        if idempotency_key is not None:
            keys.append(self.keys.idem(cid, idempotency_key))
        queue, kick_message = (None, None) if kick is None else kick
        check_user_message(message)
        if not isinstance(agent, str) or not agent:
            raise ConvoqError("agent must be the non-empty name of an agent profile")
        check_busy_args(if_busy, merge_key)
        raw = check_message_limits(message, self.limits)
        args: list[Any] = [turn_id, agent, raw, self.json_arg(options, "options"), if_busy]
        args += [self.turn_ttl_ms, self.events_maxlen]
        queued: dict[str, Any] = {"status": "queued"}
        if options.get("metadata"):
            queued["metadata"] = options["metadata"]
        event = json.dumps(queued, separators=(",", ":"))
        if if_busy in ("queue", "reject"):
            keys += [queue] if queue is not None else []
            return await self.admitted_submit(
                cid, turn_id, agent, keys, args, kick=kick_message, queued_event=event
            )
        return await busy_submit(
            self,
            BusyCall(cid, turn_id, agent, if_busy, keys, args, queue, kick_message, event),
            merge_key,
        )

    def member(self, cid: str, turn_id: str) -> str:
        """The counted member of a turn: encoded conversation id, a space, the turn id."""
        return f"{key_part(cid)} {turn_id}"

    async def admitted_submit(
        self,
        cid: str,
        turn_id: str,
        agent: str,
        keys: list[str],
        args: list[Any],
        *,
        kick: str | None = None,
        queued_event: str = '{"status":"queued"}',
        busy: Sequence[Any] = (),
    ) -> SubmitResult:
        """Run the ``submit`` script within the limits (see the module docstring);
        ``kick``: the message the script pushes onto the queue list (its last key);
        ``queued_event``: the data JSON of the turn's first event; ``busy``: ARGV[11 ..]
        of a double-texting mode (:mod:`convoq.redis._texting`)."""
        counted = self.queue_limits.counted
        args = [*args, self.queue_limits.per_conversation or 0, queued_event]
        if kick is not None or busy:
            args.append(kick or "")
        args += busy
        if counted:
            await self._admit(cid, turn_id, agent)
        try:
            reply = SubmitReply.parse(await self.run_acked("submit", cid, keys, args))
            result = self._submitted(reply, cid, turn_id)
        except NotDurableError:
            raise  # applied on the primary: stays counted (reconciled if the write is lost)
        except BaseException:
            if counted:
                await self.unadmit_quietly(cid, turn_id)
            raise
        if counted and result.duplicate and (result.turn_id != turn_id or result.position < 0):
            # Counted under the first submit's id, or already ended: not this one.
            await self.unadmit_quietly(cid, turn_id)
        if counted and result.merged_into is not None and not result.duplicate:
            await self.unadmit_quietly(cid, turn_id)  # ended "merged" at once
        return result

    def _submitted(self, reply: SubmitReply, cid: str, turn_id: str) -> SubmitResult:
        if reply.status == "OK":
            return SubmitResult(
                turn_id,
                reply.position,
                duplicate=False,
                event_id=reply.event_id,
                created_ms=reply.created_ms,
                kicked=reply.kicked,
                stopped=reply.stopped or None,
            )
        if reply.status == "MOVED":
            raise HeadMoved(cid)
        if reply.status == "MERGED":
            return SubmitResult(turn_id, reply.position, duplicate=False, merged_into=reply.turn_id)
        if reply.status == "DUP":
            return SubmitResult(reply.turn_id, reply.position, duplicate=True)
        if reply.status == "FULL":
            raise self._full("conversation", self.queue_limits.per_conversation, cid)
        assert reply.refusal is not None
        raise self.refusal(reply.refusal, cid, turn_id)

    async def _admit(self, cid: str, turn_id: str, agent: str) -> None:
        limits = self.queue_limits
        members, counts, _ = self.keys.queue_keys()
        args = [self.member(cid, turn_id), agent, limits.total or 0, limits.per_agent or 0]
        reply = AdmitReply.parse(await self.scripts.run("admit", [members, counts], args))
        if reply.full is not None:
            limit = limits.total if reply.full == "total" else limits.per_agent
            raise self._full(reply.full, limit, cid, agent=agent)
        if reply.refusal is not None:
            raise self.refusal(reply.refusal, cid, turn_id)

    def _full(self, which: str, limit: int | None, cid: str, **details: Any) -> QueueFullError:
        whose = {
            "conversation": f"conversation {cid!r}",
            "agent": f"agent {details.get('agent')!r}",
        }.get(which, "the deployment")
        setting = f"CONVOQ_MAX_QUEUED_{'TOTAL' if which == 'total' else 'PER_' + which.upper()}"
        return QueueFullError(
            f"{whose} has {limit} turns queued, its limit ({setting}); nothing was queued:"
            f" try again in {self.queue_limits.retry_after_s:g}s",
            limit=which,
            max_queued=limit or 0,
            retry_after_s=self.queue_limits.retry_after_s,
            conversation_id=cid,
            **details,
        )

    async def unadmit(self, pairs: list[tuple[str, str]]) -> int:
        """Uncount ended turns (``(cid, turn_id)`` pairs); returns how many were counted."""
        if not pairs:
            return 0
        members, counts, _ = self.keys.queue_keys()
        args = [self.member(cid, tid) for cid, tid in pairs]
        uncounted = await self.scripts.run("unadmit", [members, counts], args)
        reply = CountReply.parse("unadmit", uncounted)
        if reply.refusal is not None:
            raise self.refusal(reply.refusal, pairs[0][0], None)
        return reply.count

    async def unadmit_quietly(self, cid: str, turn_id: str) -> None:
        """Uncount one turn; a failure is logged (the sweeper reconciles it later)."""
        try:
            await self.unadmit([(cid, turn_id)])
        except Exception as exc:
            log.warning("could not uncount turn %s/%s (reconciled later): %s", cid, turn_id, exc)

    async def queued_counts(self) -> dict[str, int]:
        """The deployment-wide counts: agent name -> turns counted, ``"*"`` -> all."""
        raw = await self.redis.hgetall(self.keys.queue_keys()[1])
        return {text(k): int(v) for k, v in raw.items()}

    async def reconcile_admitted(self, *, batch: int = 200, grace_ms: int = 60_000) -> int:
        """Uncount up to ``batch`` counted turns that ended without being uncounted (see
        the module docstring); returns how many."""
        members, _, cursor_key = self.keys.queue_keys()
        start = int(await self.redis.get(cursor_key) or 0)
        cursor, found = await self.redis.hscan(members, start, count=batch)
        if not found and cursor == start == 0:
            return 0  # nothing counted (no limits set): nothing written either
        await self.redis.set(cursor_key, cursor)
        seconds, micros = await self.redis.time()
        old_before = seconds * 1000 + micros // 1000 - grace_ms
        ended: list[tuple[str, str]] = []
        for member, value in (found if isinstance(found, dict) else {}).items():
            turn = _counted_turn(text(member), text(value), old_before)
            if turn is None:
                continue
            status = await self.redis.hget(self.keys.turn(*turn), "status")
            if status is None or text(status) in FINAL_STATUSES:
                ended.append(turn)
        done = await self.unadmit(ended)
        if done:
            log.info("uncounted %d ended turn(s) that still counted as queued", done)
        return done


def _counted_turn(member: str, value: str, old_before: int) -> tuple[str, str] | None:
    """``(cid, turn id)`` of a member admitted before ``old_before`` (ms), else None
    (admitted within the grace, or not a member this code wrote)."""
    admitted, _, _agent = value.partition(" ")
    part, _, tid = member.partition(" ")
    cid = from_key_part(part)
    if not admitted.isdigit() or int(admitted) >= old_before or cid is None:
        return None
    try:
        return cid, check_turn_id(tid)
    except InvalidConversationIdError:
        return None

"""Scheduled turns on durable timers: ``schedule``, ``fire`` and the timer index.

A scheduled turn gets its record at once (status ``scheduled``, with ``due_ms``) and a
timer in its conversation's ``timers`` sorted set, both written by one ``schedule``
script call; it joins no inbox until it is due. Then ``fire`` (one script call on the
conversation) moves every due timer's turn to the back of the inbox as ``queued``: the
``ZREM`` inside the script decides, so a timer fires once however many pollers race and
whatever is resent.

Finding the conversations with due timers without scanning the keyspace takes one more
sorted set, the *index* (:meth:`~convoq.redis.keys.KeySchema.timer_index`: encoded
conversation id -> its earliest due ms). It lives in a slot of its own, so no script can
write it together with a conversation's keys (Redis Cluster). The order of writes makes
that safe:

- ``schedule`` writes the turn and its timer first, then ``ZADD ... LT`` on the index (an
  entry only ever moves earlier);
- the poller fires a due conversation, then *removes* its index entry and *then* reads
  the conversation's earliest remaining timer and adds that back (``ZADD LT``). A
  schedule whose index write came before the removal has its timer in the zset already,
  which the read after the removal sees; one whose index write comes after the removal
  stays. No timer is left without an entry at least as early as itself, except when a
  scheduling client dies between its two writes: the periodic repair
  (:meth:`SchedulingMixin.repair_timer_index`, a SCAN of the timers keys) restores it,
  and a resent schedule (same idempotency key) writes the entry again.

An entry may be early (a stale one): the poller then fires nothing and sets it right.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from convoq.context import Scheduler, ScheduleRequest, check_metadata
from convoq.errors import ConvoqError, InvalidScheduleError
from convoq.ids import check_conversation_id, from_key_part, key_part, new_turn_id
from convoq.messages import Message, check_user_message, coerce_user_message
from convoq.redis._base import ProtocolBase
from convoq.redis._codec import check_message_limits, text
from convoq.redis._due import Due, check_due
from convoq.redis._records import TurnRecord, decode_record
from convoq.redis._refusals import Refusal, malformed
from convoq.redis._replies import _Items

if TYPE_CHECKING:
    from convoq.redis.roles import ScheduleStore

# Timers read (and fired) per conversation per call: a long backlog fires in rounds.
FIRE_BATCH = 100
# Conversations the poller takes from the index per round.
DUE_BATCH = 200
# Conversations whose timers the index repair reads per pipelined round trip.
REPAIR_BATCH = 500


@dataclass(frozen=True)
class ScheduleResult:
    """A scheduled turn: its id, and ``duplicate`` when an earlier schedule (same
    idempotency key or turn id) had stored it (``due_ms``/``created_ms``/``event_id``
    are then 0/0/"")."""

    turn_id: str
    duplicate: bool
    due_ms: int = 0
    created_ms: int = 0
    event_id: str = ""


@dataclass(frozen=True)
class Fired:
    """What one ``fire`` call did: ``position`` of the first turn it queued (0: the
    conversation was idle, kick it; -1: none queued), how many it ``queued``, the server
    time it fired at, the due ms of the next timer left (None: none), and how late each
    turn queued was fired after its due time (``lags_ms``, by the script's clock)."""

    position: int
    queued: int
    now_ms: int
    next_due_ms: int | None
    lags_ms: tuple[int, ...] = ()


@dataclass(frozen=True)
class ScheduledTurn:
    """A turn waiting for its time (``client.scheduled(cid)``)."""

    conversation_id: str
    turn_id: str
    due_ms: int
    record: TurnRecord


def store_scheduler(store: ScheduleStore) -> Scheduler:
    """What ``ctx.schedule`` calls on a worker (and for a Redis memory): the request
    checked, then stored as a scheduled turn under its idempotency key."""

    async def schedule(request: ScheduleRequest) -> str:
        cid = check_conversation_id(request.conversation_id)
        due = check_due(request.not_before, request.delay_s)
        if due is None:
            raise InvalidScheduleError(
                "ctx.schedule needs delay_s= or not_before= (a timezone-aware datetime)",
                field="delay_s",
            )
        message = coerce_user_message(request.message)
        # Kept with the turn as a submit keeps it: the instant asked for, or the delay.
        asked = {"at_ms": due.at_ms, "delay_s": request.delay_s}
        options: dict[str, Any] = {"schedule": {k: v for k, v in asked.items() if v is not None}}
        if meta := check_metadata(request.metadata):
            options["metadata"] = meta
        result = await store.schedule(
            cid, new_turn_id(), agent=request.agent, message=message, options=options,
            due=due, idempotency_key=request.idempotency_key,
        )  # fmt: skip
        return result.turn_id

    return schedule


def _schedule_reply(reply: Any) -> tuple[str, list[Any], Refusal | None]:
    r = _Items("schedule", reply)
    if r.status == "OK":
        r.sized(3)
        return "OK", [r.string(1), r.integer(2), r.integer(3)], None
    if r.status == "DUP":
        return "DUP", [r.sized(1).string(1)], None
    return r.status, [], r.refusal()


def _fire_reply(reply: Any) -> tuple[Fired | None, Refusal | None]:
    r = _Items("fire", reply)
    if r.status != "OK":
        return None, r.refusal()
    r.sized(5)
    nxt = r.integer(4)
    lags = r.array(5)
    if not all(isinstance(lag, int) and not isinstance(lag, bool) for lag in lags):
        raise malformed("fire", reply, "OK and the lags as a list of integers")
    return Fired(
        r.integer(1), r.integer(2), r.integer(3), None if nxt < 0 else nxt, tuple(lags)
    ), None


class SchedulingMixin(ProtocolBase):
    """``schedule``, ``fire_due``, ``scheduled_turns`` and the timer index."""

    async def schedule(
        self,
        cid: str,
        turn_id: str,
        *,
        agent: str,
        message: Message,
        options: dict[str, Any],
        due: Due,
        idempotency_key: str | None = None,
        if_busy: Literal["queue", "reject"] = "queue",
    ) -> ScheduleResult:
        """Store a scheduled turn and its timer, then index its conversation (see the
        module docstring). A known idempotency key or turn id stores nothing and answers
        with the first turn (its index entry is written again: a resend repairs it).
        ``if_busy="reject"``: refused while the conversation is busy now (turns queued or
        its lease held), as a submit is.

        Raises:
            InvalidScheduleError: ``due`` names no time in range (nothing stored).
            ConversationBusyError: ``if_busy="reject"`` and the conversation is busy.
        """
        keys = [self.keys.meta(cid), self.keys.timers(cid), self.keys.turn(cid, turn_id)]
        keys += [self.keys.events(cid, turn_id), self.keys.inbox(cid), self.keys.lease(cid)]
        if idempotency_key is not None:
            keys.append(self.keys.idem(cid, idempotency_key))
        check_user_message(message)
        if not isinstance(agent, str) or not agent:
            raise ConvoqError("agent must be the non-empty name of an agent profile")
        raw = check_message_limits(message, self.limits)
        meta = options.get("metadata")
        args: list[Any] = [turn_id, agent, raw, self.json_arg(options, "options")]
        args += [self.turn_ttl_ms, self.events_maxlen]
        args += [
            "" if due.at_ms is None else due.at_ms,
            "" if due.delay_ms is None else due.delay_ms,
        ]
        args.append(json.dumps(meta, separators=(",", ":")) if meta else "")
        args.append(if_busy)
        status, items, refusal = _schedule_reply(await self.run_acked("schedule", cid, keys, args))
        if status == "BAD_DUE":
            raise InvalidScheduleError(
                f"the due time of turn {turn_id!r} is out of range; nothing was stored",
                conversation_id=cid,
            )
        if refusal is not None:
            raise self.refusal(refusal, cid, turn_id)
        if status == "DUP":
            first = items[0]
            record = await self.redis.hmget(self.keys.turn(cid, first), "status", "due_ms")
            if record[0] is not None and text(record[0]) == "scheduled" and record[1]:
                await self.index_timer(cid, int(record[1]))
            return ScheduleResult(first, duplicate=True)
        event_id, created_ms, due_ms = items
        await self.index_timer(cid, due_ms)
        return ScheduleResult(turn_id, False, due_ms, created_ms, event_id)

    async def index_timer(self, cid: str, due_ms: int) -> None:
        """Make the conversation's index entry no later than ``due_ms``."""
        await self.redis.zadd(self.keys.timer_index(), {key_part(cid): due_ms}, lt=True)

    async def due_conversations(self, limit: int = DUE_BATCH) -> tuple[list[str], int]:
        """Conversations whose index entry is due by the Redis clock (at most ``limit``,
        earliest first), and that clock in ms."""
        seconds, micros = await self.redis.time()
        now = seconds * 1000 + micros // 1000
        found = await self.redis.zrangebyscore(self.keys.timer_index(), "-inf", now, 0, limit)
        cids = [cid for part in found if (cid := from_key_part(text(part))) is not None]
        return cids, now

    async def fire_due(self, cid: str) -> Fired:
        """Fire the conversation's due timers (their turns join its inbox, in due order),
        then set its index entry right: removed, then the earliest timer left added back
        (see the module docstring)."""
        total = Fired(-1, 0, 0, None)
        while True:
            seconds, micros = await self.redis.time()
            now = seconds * 1000 + micros // 1000
            timers = self.keys.timers(cid)
            read = await self.redis.zrangebyscore(timers, "-inf", now, 0, FIRE_BATCH)
            due = [text(t) for t in read]
            fired = await self._fire(cid, due) if due else Fired(-1, 0, now, None)
            first = total.position if total.position >= 0 else fired.position
            lags = total.lags_ms + fired.lags_ms
            total = Fired(first, total.queued + fired.queued, fired.now_ms, None, lags)
            if len(due) < FIRE_BATCH:
                break
        await self.reindex(cid)
        return total

    async def _fire(self, cid: str, due: list[str]) -> Fired:
        keys = [self.keys.inbox(cid), self.keys.timers(cid)]
        for tid in due:
            keys += [self.keys.turn(cid, tid), self.keys.events(cid, tid)]
        fired, refusal = _fire_reply(
            await self.run_acked("fire", cid, keys, [self.events_maxlen, *due])
        )
        if refusal is not None:
            raise self.refusal(refusal, cid, None)
        assert fired is not None
        return fired

    async def reindex(self, cid: str) -> None:
        """Remove the conversation's index entry, then add back its earliest timer's due
        time, if any (in this order: see the module docstring)."""
        member = key_part(cid)
        await self.redis.zrem(self.keys.timer_index(), member)
        first = await self.redis.zrange(self.keys.timers(cid), 0, 0, withscores=True)
        if first:
            await self.index_timer(cid, int(first[0][1]))

    async def repair_timer_index(self) -> dict[str, int]:
        """Give every conversation with timers an index entry at least as early as its
        earliest timer (a scheduling client may have died between its two writes).
        Returns how many timers each conversation with timers has. On a Cluster, the
        SCAN visits every primary (redis-py's cluster client runs it on each)."""
        waiting: dict[str, int] = {}
        batch: list[str] = []
        async for key in self.redis.scan_iter(match=self.keys.timers_pattern(), count=1000):
            cid = self.keys.conversation_of_timers(key)
            if cid is not None:
                batch.append(cid)
            if len(batch) >= REPAIR_BATCH:
                await self._repair(batch, waiting)
        await self._repair(batch, waiting)
        return waiting

    async def _repair(self, batch: list[str], waiting: dict[str, int]) -> None:
        """Index each conversation of ``batch`` by its earliest timer, and count its
        timers in ``waiting``; ``batch`` is emptied."""
        if not batch:
            return
        # Not a transaction: the keys are on many slots (one round trip per node).
        async with self.redis.pipeline(transaction=False) as pipe:
            for cid in batch:
                pipe.zrange(self.keys.timers(cid), 0, 0, withscores=True)
                pipe.zcard(self.keys.timers(cid))
            replies = await pipe.execute()
        for i, cid in enumerate(batch):
            first, count = replies[2 * i], replies[2 * i + 1]
            if first:
                waiting[cid] = int(count)
                await self.index_timer(cid, int(first[0][1]))
        batch.clear()

    async def scheduled_turns(self, cid: str, *, limit: int = 100) -> list[ScheduledTurn]:
        """The conversation's turns waiting for their time, earliest first (at most
        ``limit``)."""
        timers: list[Any] = await self.redis.zrange(
            self.keys.timers(cid), 0, limit - 1, withscores=True
        )
        turns: list[ScheduledTurn] = []
        for member, score in timers:
            tid = text(member)
            raw: dict[Any, Any] = await self.redis.hgetall(self.keys.turn(cid, tid))
            if not raw:
                continue  # its conversation was cleared under it
            fields = {text(k): v for k, v in raw.items()}
            record = decode_record(cid, tid, fields, self.keys.turn(cid, tid))
            if record.status == "scheduled":
                turns.append(ScheduledTurn(cid, tid, int(score), record))
        return turns

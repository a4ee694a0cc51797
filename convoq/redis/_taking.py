"""Taking turns: ``acquire`` (the lease and the head turn), ``renew`` and ``release`` of the
lease, the report of a run cut off (``report_cut_off``), and the hand-off with which commit
and fail end, and how their replies become :class:`~convoq.redis._records.Acquired`.

The scripts share the Lua side (``take_head`` and ``hand_over`` in ``lua/_lib.lua``); this
module shares the Python side: the ``take_options`` arguments they all take, the keys of
the turn expected next, and the decoding of a handed-out turn.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from redis.exceptions import ResponseError

from convoq import defaults
from convoq.errors import (
    ConvoqError,
    CorruptDataError,
    UnsupportedFormatVersionError,
)
from convoq.ids import check_conversation_id, check_turn_id
from convoq.redis._base import REDIS_UNAVAILABLE, ProtocolBase
from convoq.redis._codec import text
from convoq.redis._history import decode_window, read_chunked
from convoq.redis._records import (
    Acquired,
    Handoff,
    Taking,
    TurnEnding,
    decode_record,
    decode_state,
)
from convoq.redis._refusals import corrupt_data
from convoq.redis._replies import (
    CutOffReply,
    EndReply,
    Outcome,
    RunningReply,
    Taken,
    TakeReply,
)
from convoq.window import AgentWindows

log = logging.getLogger("convoq.redis")

# Each retry of acquire follows a turn that was dropped, failed or changed meanwhile.
_MAX_RETRIES = 1000


def valid_turn_id(value: bytes | str | None) -> str | None:
    """``value`` as a turn id, or None if it cannot name a turn (and so a key)."""
    if value is None:
        return None
    try:
        return check_turn_id(text(value))
    except ConvoqError:
        return None


def max_attempts_error(max_attempts: int) -> dict[str, Any]:
    """The error of a turn whose worker died in ``max_attempts`` runs: the take that would
    start one more fails it instead, adding the counts of its runs to the details
    (``crashed_runs``, ``cut_off_runs``, ``attempts``)."""
    return {
        "type": "MaxAttemptsExceededError",
        "message": f"the turn's worker died in {max_attempts} runs (CONVOQ_MAX_ATTEMPTS):"
        " each ended without its worker coming back (killed, out of memory, or its process"
        " crashed); look for a crash or an OOM kill in the agent or its tools, then retry"
        " the turn (client.retry, convoq retry): it goes on from its journal",
        "details": {"max_attempts": max_attempts},
    }


def max_cut_offs_error(max_cut_offs: int) -> dict[str, Any]:
    """The error of a turn whose runs were cut off from Redis ``max_cut_offs`` times (each
    run's worker lived, lost its lease and reported it), with the counts as
    :func:`max_attempts_error`."""
    return {
        "type": "MaxCutOffsExceededError",
        "message": f"the turn's workers lost their connection to Redis in {max_cut_offs}"
        " runs (CONVOQ_MAX_CUT_OFFS): each worker lived but lost the turn's lease (or"
        " stalled past it); check the network between the workers and Redis, and Redis"
        " itself, then retry the turn (client.retry, convoq retry): it goes on from its"
        " journal",
        "details": {"max_cut_offs": max_cut_offs},
    }


@functools.lru_cache(maxsize=64)
def _over_limit_errors(max_attempts: int, max_cut_offs: int) -> tuple[str, str]:
    """The error JSON a take stores for a turn over ``max_attempts`` (crashed runs) and
    over ``max_cut_offs`` (runs cut off from Redis): the same for every call (built once,
    not per turn; the script adds the counts of the turn's runs)."""
    return (
        json.dumps(max_attempts_error(max_attempts), separators=(",", ":"), ensure_ascii=False),
        json.dumps(max_cut_offs_error(max_cut_offs), separators=(",", ":"), ensure_ascii=False),
    )


class TakingMixin(ProtocolBase):
    """``acquire`` and the turn a commit or fail hands over."""

    async def acquire(
        self,
        cid: str,
        *,
        worker_id: str,
        lease_ms: int,
        window: int | AgentWindows = 0,
        max_attempts: int = defaults.MAX_ATTEMPTS,
        head: str | None = None,
        fence: int = 0,
        max_cut_offs: int = defaults.MAX_CUT_OFFS,
    ) -> Acquired | None:
        """The turn :meth:`take` hands out (None: none), for a caller that owes nothing to
        turns failed on the way (they are failed all the same)."""
        windows = AgentWindows.of(window)
        taking = Taking(worker_id, lease_ms, windows, max_attempts, fence, max_cut_offs)
        return (await self.take(cid, taking, head=head)).turn

    async def take(self, cid: str, taking: Taking, *, head: str | None = None) -> Handoff:
        """Take the conversation's lease (a new fence, or ``taking.fence``: a lease kept
        for this caller by a commit or fail that requeued the conversation) and its head
        turn with the history window of its agent (``taking.windows``; a turn's own
        ``keep_last_turns`` option wins). No turn: nothing queued, the lease is live
        elsewhere, or the head is parked undecided. Heads over ``max_attempts`` are failed
        on the way (:attr:`Handoff.failed`: finished turns whose callbacks are owed) and
        the next head is taken. ``head``: the turn id the caller believes heads the inbox,
        which saves reading it first (the script checks it and goes on with the real head
        if it is not)."""
        check_conversation_id(cid)
        first: bytes | str | None = valid_turn_id(head)
        if first is None:
            try:
                first = await self.redis.lindex(self.keys.inbox(cid), 0)
            except ResponseError as exc:
                if not str(exc).startswith("WRONGTYPE"):
                    raise
                raise corrupt_data(self.keys.inbox(cid)) from None
        return await self._take(cid, first, taking)

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
        reply = RunningReply.parse("renew", await self.scripts.run("renew", keys, args))
        if reply.refusal is not None:
            raise self.refusal(reply.refusal, cid, turn_id, fence)
        return reply.cancel_requested

    async def release(self, cid: str, turn_id: str, *, fence: int) -> bool:
        """Hand the conversation back unfinished (a worker shutting down): free the lease
        held with ``fence`` so any worker takes ``turn_id`` at once (not counted as an
        attempt; its journal stays). False when the lease had moved on already."""
        keys = [self.keys.lease(cid), self.keys.inbox(cid), self.keys.turn(cid, turn_id)]
        reply = Outcome.parse("release", await self.scripts.run("release", keys, [fence, turn_id]))
        if reply.refusal is not None:
            raise self.refusal(reply.refusal, cid, turn_id, fence)
        return reply.status == "OK"

    async def report_cut_off(self, cid: str, turn_id: str, *, fence: int) -> bool:
        """Report that this worker lost its run of ``turn_id`` (taken with ``fence``) while
        it lived: its lease lapsed or moved on, or Redis could not be reached. The run then
        counts as cut off, not crashed (``max_cut_offs`` bounds those, ``max_attempts``
        the runs whose worker never reported), and a lease still held with ``fence`` is
        freed. True when counted; False when that run was reported already or the turn
        moved on (finished, or retried). Safe to resend."""
        keys = [self.keys.lease(cid), self.keys.inbox(cid), self.keys.turn(cid, turn_id)]
        reply = CutOffReply.parse(await self.scripts.run("cut_off", keys, [fence, turn_id]))
        if reply.refusal is not None:
            raise self.refusal(reply.refusal, cid, turn_id, fence)
        return reply.counted

    def take_args(self, t: Taking) -> list[Any]:
        """The ``take_options`` ARGV block of acquire, commit and fail."""
        over_attempts, over_cut_offs = _over_limit_errors(t.max_attempts, t.max_cut_offs)
        return [
            self.turn_ttl_ms,
            self.events_maxlen,
            t.lease_ms,
            t.windows.encoded,
            t.max_attempts,
            over_attempts,
            t.max_cut_offs,
            over_cut_offs,
        ]

    def next_turn_keys(self, cid: str, next_turn_id: str | None) -> list[str]:
        """The keys of the turn a commit or fail expects next ([] for none)."""
        return [] if next_turn_id is None else self.keys.turn_keys(cid, next_turn_id)

    async def _take(self, cid: str, head: bytes | str | None, t: Taking) -> Handoff:
        options = self.take_args(t)
        failed: list[str] = []
        for _ in range(_MAX_RETRIES):
            if head is None:
                break
            tid = self._head_id(cid, head)
            keys = [*self.keys.history_keys(cid), self.keys.inbox(cid), self.keys.lease(cid)]
            keys += self.keys.turn_keys(cid, tid)
            args = [tid, t.worker_id, t.fence, *options]
            reply = TakeReply.parse(await self.scripts.run("acquire", keys, args))
            failed += [reply.failed] if reply.failed else []
            if reply.taken is not None:
                return Handoff(await self._acquired(cid, tid, reply.taken), tuple(failed))
            if reply.refusal is not None:
                raise self.refusal(reply.refusal, cid, tid)
            if reply.status != "RETRY":
                break  # EMPTY or BUSY
            head = reply.head
        # Else the inbox kept changing under us; the sweeper kicks it again.
        return Handoff(None, tuple(failed))

    def _head_id(self, cid: str, head: bytes | str) -> str:
        """The id of an inbox entry (CorruptDataError naming the inbox if it is no id)."""
        try:
            return check_turn_id(text(head))
        except ConvoqError as exc:
            raise corrupt_data(self.keys.inbox(cid)) from exc

    async def _acquired(self, cid: str, tid: str, taken: Taken) -> Acquired:
        """The turn ``take_head`` handed out (in acquire's reply, or one a hand-off
        carries). A window too long for one script call came without its elements: it is
        read here in chunks, under the lease just taken."""
        key = self.keys.turn(cid, tid)
        if taken.elements is None:
            history = await read_chunked(self.scripts, self.keys, cid, taken.window)
        else:
            history = decode_window(self.keys, cid, taken.lead, taken.elements, taken.blobs)
        return Acquired(
            conversation_id=cid,
            fence=taken.fence,
            turn=decode_record(cid, tid, taken.fields, key),
            history=history,
            state=decode_state(taken.state_kind, taken.state, taken.fields, key),
            next_turn_id=valid_turn_id(taken.next_turn_id),
            summarised=taken.summarised,
        )

    async def handed(self, cid: str, ended: EndReply, ending: TurnEnding) -> Handoff:
        """The next turn after a commit or fail: the turn the script handed out itself (it
        was the one expected), else the head it named, acquired with the kept fence. The
        turn before it is already stored, so a next turn that cannot be loaded is left to
        the next acquire (after the lease expires) to report, instead of making this
        commit look failed. With ``ending.requeue`` nothing is taken: the next turn's id
        comes back as :attr:`Handoff.requeued`, its lease kept."""
        nxt = ended.next_turn_id
        if ending.requeue:
            requeued = None if nxt is None else self._head_id(cid, nxt)
            return Handoff(requeued=requeued).after(ended.failed)
        try:
            if ended.taken is None and ended.take_refusal is None:
                return (await self._take(cid, nxt, ending.taking())).after(ended.failed)
            tid = self._head_id(cid, nxt or b"")
            if ended.take_refusal is not None:
                raise self.refusal(ended.take_refusal, cid, tid)
            assert ended.taken is not None
            return Handoff(await self._acquired(cid, tid, ended.taken)).after(ended.failed)
        except (CorruptDataError, UnsupportedFormatVersionError) as exc:
            log.error("cannot hand conversation %s its next turn: %s", cid, exc.message)
        except REDIS_UNAVAILABLE as exc:
            # Redis went away between the two calls: the lease lapses and the sweeper
            # re-kicks the next turn; the stored turn must not look failed.
            log.warning("cannot hand conversation %s its next turn now: %s", cid, exc)
        return Handoff().after(ended.failed)

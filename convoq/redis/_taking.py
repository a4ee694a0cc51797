"""Handing out turns: ``acquire``, and the hand-off with which commit and fail end, and how
their replies become :class:`~convoq.redis._records.Acquired`.

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
from convoq.errors import ConvoqError, CorruptDataError, UnsupportedFormatVersionError
from convoq.ids import check_conversation_id, check_turn_id
from convoq.redis._base import (
    REDIS_UNAVAILABLE,
    ProtocolBase,
    max_attempts_error,
)
from convoq.redis._codec import pairs_to_dict, text
from convoq.redis._history import decode_window, read_chunked
from convoq.redis._records import Acquired, Taking, decode_record, decode_state
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


@functools.lru_cache(maxsize=64)
def _over_attempts_error(max_attempts: int) -> str:
    """The error JSON a take stores for a turn over ``max_attempts``: the same for every
    call (built once, not per turn)."""
    return json.dumps(max_attempts_error(max_attempts), separators=(",", ":"), ensure_ascii=False)


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
        failed: list[str] | None = None,
        head: str | None = None,
        fence: int = 0,
    ) -> Acquired | None:
        """Take the conversation's lease (a new fence) and its head turn with the history
        window of its agent (``window``: turns for every agent, or by agent; a turn's own
        ``keep_last_turns`` option wins). None: nothing queued, the lease is live elsewhere,
        or the head is parked undecided. Heads over ``max_attempts`` or with an expired
        approval are failed on the way and the next head is taken; their ids are appended to
        ``failed`` (they are finished turns whose callbacks are owed). ``head``: the turn id
        the caller believes heads the inbox, which saves reading it first (the script checks
        it and goes on with the real head if it is not). ``fence``: a lease kept for this
        caller by a commit or fail that requeued the conversation
        (:attr:`TurnEnding.requeued`), taken over as is; 0 takes a new one."""
        check_conversation_id(cid)
        first: bytes | str | None = valid_turn_id(head)
        if first is None:
            try:
                first = await self.redis.lindex(self.keys.inbox(cid), 0)
            except ResponseError as exc:
                if not str(exc).startswith("WRONGTYPE"):
                    raise
                raise self.refusal(["CORRUPT", self.keys.inbox(cid)], cid, "?") from None
        taking = Taking(worker_id, lease_ms, AgentWindows.of(window), max_attempts, fence, failed)
        return await self._take(cid, first, taking)

    def take_args(self, t: Taking) -> list[Any]:
        """The ``take_options`` ARGV block of acquire, commit and fail."""
        return [
            self.turn_ttl_ms,
            self.events_maxlen,
            t.lease_ms,
            t.windows.encode(),
            t.max_attempts,
            _over_attempts_error(t.max_attempts),
        ]

    def next_turn_keys(self, cid: str, next_turn_id: str | None) -> list[str]:
        """The keys of the turn a commit or fail expects next ([] for none)."""
        return [] if next_turn_id is None else self.keys.turn_keys(cid, next_turn_id)

    async def _take(self, cid: str, head: bytes | str | None, t: Taking) -> Acquired | None:
        options = self.take_args(t)
        for _ in range(_MAX_RETRIES):
            if head is None:
                return None
            tid = self._head_id(cid, head)
            keys = [*self.keys.history_keys(cid), self.keys.inbox(cid), self.keys.lease(cid)]
            keys += self.keys.turn_keys(cid, tid)
            reply = await self.scripts.run("acquire", keys, [tid, t.worker_id, t.fence, *options])
            if reply[0] == "OK":
                return await self._acquired(cid, tid, reply)
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

    async def _acquired(self, cid: str, tid: str, reply: list[Any]) -> Acquired:
        """The turn of an 'OK' reply of ``take_head`` (acquire's, or one a hand-off
        carries). A window too long for one script call came without its elements: it is
        read here in chunks, under the lease just taken."""
        fields = pairs_to_dict(reply[2])
        key = self.keys.turn(cid, tid)
        kind = text(reply[3]) if isinstance(reply[3], bytes) else None
        if reply[6] is None:
            history = await read_chunked(self.scripts, self.keys, cid, int(reply[9]))
        else:
            history = decode_window(self.keys, cid, reply[5], reply[6], pairs_to_dict(reply[7]))
        return Acquired(
            conversation_id=cid,
            fence=int(reply[1]),
            turn=decode_record(cid, tid, fields, key),
            history=history,
            state=decode_state(kind, reply[4], fields, key),
            next_turn_id=valid_turn_id(reply[8]),
        )

    async def handed(
        self, cid: str, reply: list[Any], t: Taking, requeued: list[str] | None = None
    ) -> Acquired | None:
        """The next turn, from the 'OK' reply of commit or fail: the turn the script handed
        out itself (it was the one expected), else the head it named, acquired with the
        kept fence. The turn before it is already stored, so a next turn that cannot be
        loaded is left to the next acquire (after the lease expires) to report, instead
        of making this commit look failed. ``requeued``: take nothing; the id of the next
        turn, whose lease is kept, is appended there."""
        t.note_failed(reply, 2)
        if requeued is not None:
            if reply[1]:
                requeued.append(self._head_id(cid, reply[1]))
            return None
        taken = reply[3] if len(reply) > 3 else None
        try:
            if taken is None:
                return await self._take(cid, reply[1], t)
            tid = self._head_id(cid, reply[1])
            if taken[0] != b"OK":
                raise self.refusal([text(taken[0]), *taken[1:]], cid, tid)
            return await self._acquired(cid, tid, taken)
        except (CorruptDataError, UnsupportedFormatVersionError) as exc:
            log.error("cannot hand conversation %s its next turn: %s", cid, exc.message)
            return None
        except REDIS_UNAVAILABLE as exc:
            # Redis went away between the two calls: the lease lapses and the sweeper
            # re-kicks the next turn; the stored turn must not look failed.
            log.warning("cannot hand conversation %s its next turn now: %s", cid, exc)
            return None

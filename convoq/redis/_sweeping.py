"""What the sweeper asks of the protocol: the conversations to kick again (queued turns
and no live lease), and its note of the kicks it sent. Uncounting ended turns is
:meth:`reconcile_admitted`, with the limits it keeps (:mod:`convoq.redis._submitting`).

A conversation whose kick waits (in the broker behind a backlog, or in a worker's own line
of kicks waiting for a slot) has no lease either, so the sweeper holds back: after it
kicks an inbox head it writes ``swept(cid)`` = ``"kicks hold_ms tid"``, living ``2 *
hold_ms``. While more than ``hold_ms`` of that note is left the same head is not kicked
again; in the second half the note only remembers the count, so the next kick of the same
head holds twice as long: one sweep interval after the first kick, then 2, 4, 8 and at
most :data:`BACKOFF_CAP` intervals. A head that changed starts over, and so does a head
whose note a pass found beside a live lease (a worker took that kick: a crash after it is
a new loss, found as soon as the lease expires). The note lives in the conversation's
slot and expires by itself, so a deleted conversation leaves it for at most
``2 * BACKOFF_CAP`` intervals.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from convoq.redis._base import ProtocolBase
from convoq.redis._codec import text
from convoq.redis._taking import valid_turn_id

log = logging.getLogger("convoq.redis")

BACKOFF_CAP = 16
"""The longest hold between two kicks of one waiting head, in sweep intervals (80 s at the
default 5 s). It bounds how late a kick lost after the sweeper kicked that head once is
sent again (a broker restart loses the whole backlog's kicks, and the workers idle until
they are resent), while a head waiting behind a backlog costs one broker message per
``BACKOFF_CAP`` intervals instead of one per pass."""

# Conversations read in one pipeline round trip (4 commands each).
_BATCH = 500


@dataclass(frozen=True, slots=True)
class Stranded:
    """A conversation to kick: its inbox head, and the sweeper's kicks of that head so far
    that its note still remembers."""

    cid: str
    head: str
    kicks: int = 0


@dataclass(slots=True)
class SweepScan:
    """One pass's finding: the conversations to kick, and how many waiting heads were held
    back (their hold since the sweeper last kicked them has not passed)."""

    due: list[Stranded] = field(default_factory=list)
    held: int = 0


def hold_ms(kicks: int, interval_ms: int) -> int:
    """How long a head waits after the sweeper's ``kicks``-th kick of it before the next."""
    # The shift is bounded: a note's count is read from Redis and may be anything.
    return interval_ms * min(1 << min(max(kicks - 1, 0), 30), BACKOFF_CAP)


def _remembered(note: bytes | None, head: str, left_ms: int) -> int | None:
    """The kicks of ``head`` the note counts, or None while it holds the head back. A note
    of another head, or one this code cannot read, counts nothing."""
    if note is None:
        return 0
    parts = text(note).split(" ", 2)
    if len(parts) != 3 or parts[2] != head or not (parts[0].isdigit() and parts[1].isdigit()):
        return 0
    kicks, hold = int(parts[0]), int(parts[1])
    return None if left_ms > hold else kicks


class SweepingMixin(ProtocolBase):
    """``sweep_candidates``, ``sweep_scan`` and ``mark_swept``."""

    async def sweep_candidates(self) -> list[str]:
        """Conversations with queued turns and no live lease whose hold since the sweeper
        last kicked their head has passed: kick them. A parked turn whose approval expired
        is among them (its parked lease is gone): the acquire that follows records its
        undecided calls as expired and runs it to its end."""
        return [found.cid for found in (await self.sweep_scan()).due]

    async def sweep_scan(self) -> SweepScan:
        """:meth:`sweep_candidates` with their heads and kick counts, and the count of
        waiting heads held back. Notes found beside a live lease are deleted."""
        scan, seen, batch = SweepScan(), set[str](), list[str]()
        async for key in self.redis.scan_iter(match=self.keys.inbox_pattern(), count=1000):
            cid = self.keys.conversation_of_inbox(key)
            # SCAN may return a key twice; a second kick of it would be a duplicate.
            if cid is None or cid in seen:
                continue
            seen.add(cid)
            batch.append(cid)
            if len(batch) >= _BATCH:
                await self._look(batch, scan)
                batch.clear()
        await self._look(batch, scan)
        return scan

    async def mark_swept(self, kicked: Sequence[Stranded], *, interval_ms: int) -> None:
        """Note each kick the sweeper sent, so the next passes hold that head back."""
        if not kicked:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for found in kicked:
                kicks = found.kicks + 1
                hold = hold_ms(kicks, interval_ms)
                pipe.set(self.keys.swept(found.cid), f"{kicks} {hold} {found.head}", px=2 * hold)
            await pipe.execute()

    async def _look(self, cids: list[str], scan: SweepScan) -> None:
        """Read lease, head and note of each conversation in one round trip (a pipeline:
        on a cluster each command goes to its own slot's node)."""
        if not cids:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for cid in cids:
                pipe.exists(self.keys.lease(cid))
                pipe.lindex(self.keys.inbox(cid), 0)
                pipe.get(self.keys.swept(cid))
                pipe.pttl(self.keys.swept(cid))
            replies = await pipe.execute()
        taken: list[str] = []
        for index, cid in enumerate(cids):
            leased, head, note, left_ms = replies[4 * index : 4 * index + 4]
            if leased:
                if note is not None:
                    taken.append(cid)
                continue
            tid = self._valid_head(cid, head)
            if tid is None:
                continue
            kicks = _remembered(note, tid, int(left_ms))
            if kicks is None:
                scan.held += 1
            else:
                scan.due.append(Stranded(cid, tid, kicks))
        if taken:
            async with self.redis.pipeline(transaction=False) as pipe:
                for cid in taken:
                    pipe.delete(self.keys.swept(cid))
                await pipe.execute()

    @staticmethod
    def _valid_head(cid: str, head: bytes | None) -> str | None:
        """The inbox head as a turn id, or None if the inbox is empty or damaged."""
        if head is None:
            return None
        tid = valid_turn_id(head)
        if tid is None:
            # One damaged inbox must not stop the sweep of every other conversation.
            log.error("the inbox of conversation %r holds %r, not a turn id: skipped", cid, head)
        return tid

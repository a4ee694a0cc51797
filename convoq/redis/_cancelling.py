"""Stopping turns from outside the runner: ``cancel`` one turn (queued, parked or
running), ask whether a cancel was requested, and ``clear`` a whole conversation.

A running turn is not stopped here: its cancel flag is set, and its runner's next renewal
or checkpoint reports it (the runner then fails the turn as cancelled).
"""

from __future__ import annotations

from typing import Literal

from convoq.errors import ConversationMemoryError, TurnCancelledError
from convoq.ids import check_turn_id
from convoq.redis._base import ProtocolBase
from convoq.redis._codec import text
from convoq.redis._decoded import forget
from convoq.redis._replies import CancelReply, Outcome
from convoq.redis._texting import StopFlags

_CLEAR_RETRIES = 20

_CANCELLED: dict[str, Literal["cancelled", "stopping", "finished"]] = {
    "CANCELLED": "cancelled",
    "STOPPING": "stopping",
    "FINISHED": "finished",
}


def turn_control_keys(proto: ProtocolBase, cid: str, turn_id: str) -> list[str]:
    """KEYS of a script that ends a turn from outside its run (cancel, discard)."""
    keys = proto.keys
    return [keys.inbox(cid), keys.lease(cid), *keys.turn_keys(cid, turn_id)]


def cancelled_arg(proto: ProtocolBase, reason: str) -> str:
    """The error a turn ended from outside its run is stored with (cancel, discard)."""
    error = TurnCancelledError(f"the turn was cancelled: {reason}", reason=reason)
    return proto.json_arg(error.to_data(), "error")


class CancellingMixin(ProtocolBase):
    """``cancel`` (``cancel_turn``), ``is_cancel_requested``, ``clear``."""

    async def cancel(self, cid: str, turn_id: str) -> Literal["cancelled", "stopping", "finished"]:
        """Cancel a turn: queued, scheduled (its timer goes too) or parked -> "cancelled"
        at once; running -> "stopping" (its runner's next renewal or checkpoint reports
        it, and it fails the turn as cancelled); already ended -> "finished"."""
        outcome, _ = await self.cancel_turn(cid, turn_id)
        return outcome

    async def cancel_turn(
        self, cid: str, turn_id: str
    ) -> tuple[Literal["cancelled", "stopping", "finished"], str | None]:
        """:meth:`cancel`, with the turn first in the conversation's line after a
        "cancelled", read in the same call (the one to kick; None: no turn is queued, or
        another outcome)."""
        args = [turn_id, cancelled_arg(self, "cancelled by request"), self.turn_ttl_ms]
        keys = [*turn_control_keys(self, cid, turn_id), self.keys.timers(cid)]
        reply = CancelReply.parse(
            await self.scripts.run("cancel", keys, [*args, self.events_maxlen])
        )
        if reply.refusal is not None:
            raise self.refusal(reply.refusal, cid, turn_id)
        return _CANCELLED[reply.status], reply.head

    async def is_cancel_requested(self, cid: str, turn_id: str) -> bool:
        return await self.redis.hget(self.keys.turn(cid, turn_id), "cancel") == b"1"

    async def stop_flags(self, cid: str, turn_id: str) -> StopFlags:
        """The cancel flag and the double-texting stop of a turn, in one read."""
        key = self.keys.turn(cid, turn_id)
        cancel, mode, by = await self.redis.hmget(key, "cancel", "stop", "stopped_by")
        return StopFlags(cancel == b"1", text(mode) if mode else None, text(by) if by else None)

    async def clear(self, cid: str, *, force: bool = False) -> None:
        """Delete every key of the conversation. ConversationBusyError while turns are
        queued, running or parked, unless ``force`` (their records go too)."""
        inbox = self.keys.inbox(cid)
        fixed = [*self.keys.history_keys(cid), inbox, self.keys.lease(cid)]
        for _ in range(_CLEAR_RETRIES):
            queued = [check_turn_id(text(t)) for t in await self.redis.lrange(inbox, 0, -1)]
            found = {
                text(k)
                async for k in self.redis.scan_iter(
                    match=self.keys.conversation_pattern(cid), count=1000
                )
            }
            for tid in queued:
                found.update(self.keys.turn_keys(cid, tid))
            others = sorted(found.difference(fixed))
            args = ["1" if force else "0", *queued]
            reply = Outcome.parse("clear", await self.scripts.run("clear", [*fixed, *others], args))
            if reply.refusal is not None:
                raise self.refusal(reply.refusal, cid, None)
            if reply.status == "OK":
                forget(self.keys.base(cid))  # what this process decoded of it goes too
                return
        raise ConversationMemoryError(
            f"conversation {cid!r} kept changing while it was cleared; try again"
        )

"""Handing a running turn to another agent (:mod:`convoq.handoffs`): ``transfer``, fenced
like a checkpoint, and the agent the head turn of a conversation (or any turn) runs on
(where the sweeper, a handoff and the client's kicks go).
"""

from __future__ import annotations

from collections.abc import Sequence

from convoq.redis._base import ProtocolBase
from convoq.redis._codec import text
from convoq.redis._replies import RunningReply
from convoq.turn_state import TurnEvent, TurnState


class TransferringMixin(ProtocolBase):
    """``transfer``, ``head_agent`` and ``turn_agent``."""

    async def transfer(
        self,
        cid: str,
        turn_id: str,
        *,
        fence: int,
        state: TurnState,
        agent: str,
        release: bool,
        events: Sequence[TurnEvent] = (),
    ) -> None:
        """Journal the turn so far and set its record's agent to ``agent`` (the first time
        keeping the one it was queued for as ``handed_from``), after appending ``events``;
        with ``release`` free the lease too (the run not counted as a crash): the turn,
        still the inbox head, waits for a worker of ``agent``'s pool.

        Raises:
            StaleFenceError, NotInboxHeadError, TurnAlreadyAppliedError: the lease or the
            turn moved on; nothing was written.
        """
        keys = [self.keys.inbox(cid), self.keys.lease(cid), self.keys.turn(cid, turn_id)]
        keys += [self.keys.journal(cid, turn_id), self.keys.events(cid, turn_id)]
        args = [turn_id, fence, state.model_dump_json(), agent, self.turn_ttl_ms]
        args += [self.events_maxlen, "1" if release else "0", *self.event_args(events)]
        reply = RunningReply.parse("transfer", await self.scripts.run("transfer", keys, args))
        if reply.refusal is not None:
            raise self.refusal(reply.refusal, cid, turn_id, fence)

    async def head_agent(self, cid: str) -> str | None:
        """The agent the conversation's inbox head runs on (None: no head, or no record)."""
        head = await self.redis.lindex(self.keys.inbox(cid), 0)
        return None if head is None else await self.turn_agent(cid, text(head))

    async def turn_agent(self, cid: str, turn_id: str) -> str | None:
        """The agent a turn's record names (None: no record)."""
        agent = await self.redis.hget(self.keys.turn(cid, turn_id), "agent")
        return None if agent is None else text(agent)

"""What the sweeper asks of the protocol: the conversations to kick again (queued turns
and no live lease). Uncounting ended turns is :meth:`reconcile_admitted`, with the
limits it keeps (:mod:`convoq.redis._submitting`)."""

from __future__ import annotations

import logging

from convoq.redis._base import ProtocolBase
from convoq.redis._taking import valid_turn_id

log = logging.getLogger("convoq.redis")


class SweepingMixin(ProtocolBase):
    """``sweep_candidates``."""

    async def sweep_candidates(self) -> list[str]:
        """Conversations with queued turns and no live lease: kick them. A parked turn
        whose approval expired is among them (its parked lease is gone): the acquire that
        follows records its undecided calls as expired and runs it to its end."""
        found: list[str] = []
        async for key in self.redis.scan_iter(match=self.keys.inbox_pattern(), count=1000):
            cid = self.keys.conversation_of_inbox(key)
            if cid is None or await self.redis.exists(self.keys.lease(cid)):
                continue
            if await self._valid_head(cid):
                found.append(cid)
        return found

    async def _valid_head(self, cid: str) -> bool:
        """The inbox has a head, and it is a turn id."""
        head = await self.redis.lindex(self.keys.inbox(cid), 0)
        if head is None:
            return False
        if valid_turn_id(head) is None:
            # One damaged inbox must not stop the sweep of every other conversation.
            log.error("the inbox of conversation %r holds %r, not a turn id: skipped", cid, head)
            return False
        return True

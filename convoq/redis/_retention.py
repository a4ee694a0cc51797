"""Retention on Redis: the idle TTL refreshed after each turn, and pruning old turns
(erasing a conversation whole is ``clear``, :mod:`convoq.redis._cancelling`).

With ``conversation_ttl_s`` set, every per-turn key (turn record, events, idempotency key)
is written with a TTL no longer than it, and the history keys get it afresh after every
turn: so once no turn ran for that long, every key of the conversation is gone.
"""

from __future__ import annotations

from collections.abc import Sequence

from convoq.errors import ConvoqError
from convoq.ids import check_conversation_id
from convoq.redis._base import ProtocolBase
from convoq.redis._replies import CountReply
from convoq.redis.keys import KeySchema
from convoq.redis.scripts import ScriptCall


def touch_call(keys: KeySchema, cid: str, ttl_ms: int, also: Sequence[str] = ()) -> ScriptCall:
    """The script call that refreshes a conversation's idle TTL (see ``touch.lua``)."""
    retained = keys.retained_keys(cid)
    return ScriptCall("touch", [*retained, *also], [ttl_ms, len(retained)])


class RetentionMixin(ProtocolBase):
    """touch (idle TTL), prune."""

    async def touch(self, cid: str, *, also: Sequence[str] = ()) -> None:
        """Start the conversation's idle TTL afresh (a no-op without one); the keys in
        ``also`` (written by the turn, with TTLs of their own) expire no later."""
        if self.conversation_ttl_ms is not None:
            call = touch_call(self.keys, cid, self.conversation_ttl_ms, also)
            await self.scripts.perform(call)

    async def prune(self, cid: str, *, keep_last_turns: int) -> int:
        """Drop all but the newest ``keep_last_turns`` turns and the blobs only they used;
        the lead messages and the summary stay. Returns the turns dropped.

        Raises:
            ConversationBusyError: a turn is queued, running or parked (nothing changed).
        """
        check_conversation_id(cid)
        if isinstance(keep_last_turns, bool) or not isinstance(keep_last_turns, int):
            raise ConvoqError("keep_last_turns must be an int >= 0")
        if keep_last_turns < 0:
            raise ConvoqError("keep_last_turns must be >= 0 (0 drops every turn)")
        keys = [*self.keys.history_keys(cid), self.keys.inbox(cid), self.keys.lease(cid)]
        keys.append(self.keys.summary(cid))
        reply = CountReply.parse("prune", await self.scripts.run("prune", keys, [keep_last_turns]))
        if reply.refusal is not None:
            raise self.refusal(reply.refusal, cid, None)
        await self.touch(cid)
        return reply.count

"""Retention on Redis: the idle TTL refreshed after each turn, and pruning old turns
(erasing a conversation whole is ``clear``, :mod:`convoq.redis._cancelling`).

With ``conversation_ttl_s`` set, every per-turn key (turn record, events, idempotency key)
is written with a TTL no longer than it, and the history keys get it afresh after every
turn: so once no turn ran for that long, every key of the conversation is gone.

One decision. Keys of one conversation are written by several processes: the client
queues a turn (its idempotency key) and may cancel or discard it (the turn's record and
events), the workers run it. Their settings may differ, yet the keys must not outlive
the conversation, nor a client shorten what the workers keep. So the retention is the
workers': each publishes its TTLs when it starts (:meth:`RetentionMixin.publish_retention`,
the last to start wins), and a client follows them (:meth:`RetentionMixin.follow_retention`,
read again at most once a minute) before it writes; it uses its own settings only while
no worker ever published any.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from convoq.errors import ConvoqError
from convoq.ids import check_conversation_id
from convoq.redis._base import ProtocolBase
from convoq.redis._codec import text
from convoq.redis._decoded import forget
from convoq.redis._replies import CountReply
from convoq.redis.keys import KeySchema
from convoq.redis.scripts import ScriptCall


def touch_call(keys: KeySchema, cid: str, ttl_ms: int, also: Sequence[str] = ()) -> ScriptCall:
    """The script call that refreshes a conversation's idle TTL (see ``touch.lua``)."""
    retained = keys.retained_keys(cid)
    return ScriptCall("touch", [*retained, *also], [ttl_ms, len(retained)])


FOLLOW_EVERY_S = 60.0
"""How long a client keeps the workers' retention before it reads it again."""


class RetentionMixin(ProtocolBase):
    """touch (idle TTL), prune, and the one retention every writer follows."""

    # When this protocol last read the workers' retention (monotonic s; None: not yet).
    _retention_read_at: float | None = None

    async def publish_retention(self) -> None:
        """Store this protocol's TTLs as the deployment's retention (a worker, at start)."""
        ttls = {"turn_ttl_ms": self.turn_ttl_ms, "conversation_ttl_ms": self.conversation_ttl_ms}
        await self.redis.hset(self.keys.retention(), mapping={k: v or 0 for k, v in ttls.items()})

    async def follow_retention(self) -> None:
        """Take the TTLs the workers published (see the module docstring) for every key
        this protocol writes from now on; kept for :data:`FOLLOW_EVERY_S`. Without any
        published, this protocol's own settings stay (and it asks again next time)."""
        now = time.monotonic()
        if self._retention_read_at is not None and now - self._retention_read_at < FOLLOW_EVERY_S:
            return
        raw = {
            text(k): text(v) for k, v in (await self.redis.hgetall(self.keys.retention())).items()
        }
        turn, conversation = raw.get("turn_ttl_ms", ""), raw.get("conversation_ttl_ms", "")
        if not (turn.isdigit() and conversation.isdigit() and int(turn) > 0):
            return
        self.conversation_ttl_ms = int(conversation) or None
        self.turn_ttl_ms = int(turn)
        self._retention_read_at = now

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
        forget(self.keys.base(cid))  # the turns it dropped, decoded here, go too
        await self.touch(cid)
        return reply.count

"""Retrying a failed turn as the same turn: ``retry`` (``lua/retry.lua``).

A failed turn keeps its journal as long as its record (``turn_ttl_s``); ``retry`` queues
it again at the back of its conversation's inbox, with its id, its journal (finished steps
replay, tools keep their idempotency keys) and fresh budgets of crashed and cut-off runs.
Each request carries a token: a resend of the same request (redis-py resends a script
whose reply was lost) finds its token on the record and changes nothing. Under the
deployment-wide queue limits the turn is counted again, as a submit counts it.
"""

from __future__ import annotations

from dataclasses import dataclass

from convoq.errors import ConvoqError
from convoq.ids import check_conversation_id, check_turn_id
from convoq.redis._codec import text
from convoq.redis._records import FINAL_STATUSES
from convoq.redis._replies import RetryReply
from convoq.redis._submitting import SubmittingMixin

MAX_TOKEN_CHARS = 128


@dataclass(frozen=True)
class Retried:
    """A failed turn queued again: ``position`` 0 when no turn waited before it (the caller
    kicks the conversation), ``retries`` how often it was retried. ``repeated``: this was
    a resend of an earlier request, which queued it; nothing changed now, and ``status``
    is where the turn stands (else "queued"). ``agent``: the one the turn's record names
    (None: none), whose pool its kick goes to."""

    status: str
    retries: int
    position: int = 0
    repeated: bool = False
    agent: str | None = None


class RetryingMixin(SubmittingMixin):
    """``retry``."""

    async def retry(self, cid: str, turn_id: str, *, token: str) -> Retried:
        """Queue failed turn ``turn_id`` again as the same turn (see the module docstring);
        ``token`` names this request: the same for a resend, another for each request.

        Raises:
            TurnNotRetryableError: the turn did not fail (its status is named); nothing
                changed.
            UnknownTurnError: no such turn, or its record expired (``turn_ttl_s`` after it
                failed).
            QueueFullError: a limit on queued turns; nothing changed.
        """
        check_conversation_id(cid)
        check_turn_id(turn_id)
        if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN_CHARS:
            raise ConvoqError(f"a retry token is 1 to {MAX_TOKEN_CHARS} characters")
        keys = [self.keys.meta(cid), self.keys.inbox(cid), *self.keys.turn_keys(cid, turn_id)]
        args = [turn_id, token, self.events_maxlen, self.queue_limits.per_conversation or 0]
        counted = await self._admit_again(cid, turn_id)
        # Unsure whether it ran, the count stays (the sweeper uncounts it if it did not).
        reply = RetryReply.parse(await self.run_acked("retry", cid, keys, args))
        if counted and _left_final(reply):
            await self.unadmit_quietly(cid, turn_id)
        if reply.status == "OK":
            return Retried("queued", reply.retries, reply.position, agent=reply.agent)
        if reply.status == "REPEATED":
            return Retried(reply.turn_status, reply.retries, repeated=True, agent=reply.agent)
        if reply.status == "FULL":
            raise self._full("conversation", self.queue_limits.per_conversation, cid)
        assert reply.refusal is not None
        raise self.refusal(reply.refusal, cid, turn_id)

    async def _admit_again(self, cid: str, turn_id: str) -> bool:
        """Count a failed turn against the deployment-wide limits again (when they count
        turns), as its submit did; whether it was counted here. A turn that is not failed
        is left as it is (a live one is counted already; the script refuses the rest)."""
        if not self.queue_limits.counted:
            return False
        agent, status = await self.redis.hmget(self.keys.turn(cid, turn_id), ["agent", "status"])
        if agent is None or status != b"failed":
            return False
        await self._admit(cid, turn_id, text(agent))
        return True


def _left_final(reply: RetryReply) -> bool:
    """Whether the turn is final after this retry request: it did not queue the turn (a
    refusal, a full inbox), or it was a resend and the turn has ended again since."""
    if reply.status == "OK":
        return False
    if reply.status == "REPEATED":
        return reply.turn_status in FINAL_STATUSES
    if reply.refusal is not None and reply.refusal.code == "NOT_FAILED":
        said = reply.refusal.args[0] if reply.refusal.args else b""
        return text(said) in FINAL_STATUSES
    return True

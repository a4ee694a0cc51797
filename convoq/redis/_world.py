"""Waits for the world in the store: what a parked call waits for (``park``'s ``waits``),
a deferred call's result (``decide`` with a result), and signals (``signal``).

A parked turn's record holds ``waits``: by call id, what the call waits for besides a
person (a child turn, a result, a signal). A signal goes to the conversation's inbox head
when that turn is parked waiting for its name; else it is kept, oldest first, at most
``max_kept`` live ones per name for ``ttl_ms`` each, and the next park that waits for that
name takes the oldest (:file:`lua/park.lua`, :file:`lua/signal.lua`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from convoq.errors import UnknownTurnError
from convoq.redis._base import ProtocolBase
from convoq.redis._replies import SignalReply
from convoq.redis.keys import KeySchema
from convoq.turn_state import TurnState
from convoq.waits import check_signal_name

# Any valid turn id: the signal script's turn keys when the inbox is empty (never written).
_NO_TURN = "none"
# Reads of the inbox head before the head is given up on (it moves as turns end).
_HEAD_TRIES = 5


def park_waits(
    keys: KeySchema, cid: str, state: TurnState, children: Sequence[str]
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``park``'s ``waits`` argument (call id -> what it waits for) and the kept-signal
    keys it names (by index into the script's KEYS, after its six own)."""
    waits: dict[str, dict[str, Any]] = {call_id: {"on": "child"} for call_id in children}
    signal_keys: list[str] = []
    for call in state.undecided:
        wait = state.waits.get(call.id)
        if wait is None:
            continue
        if wait.on == "result":
            waits[call.id] = {"on": "result"}
            continue
        key = keys.signals(cid, wait.name or "")
        if key not in signal_keys:
            signal_keys.append(key)
        index = 7 + signal_keys.index(key)
        waits[call.id] = {"on": "signal", "name": wait.name, "key": index}
    return waits, signal_keys


def waits_described(state: TurnState) -> dict[str, dict[str, Any]]:
    """What the parked record shows of the calls that wait for the world, by call id."""
    return {
        call.id: state.waits[call.id].model_dump(mode="json")
        for call in state.undecided
        if call.id in state.waits
    }


@dataclass(frozen=True)
class Signalled:
    """What sending a signal came to: ``outcome`` "delivered" (to ``call_id`` of
    ``turn_id``, which resumes when ``resume``), "kept" (for the next wait; ``kept``
    live signals of that name now) or "duplicate" (this signal id was handled before:
    nothing written)."""

    outcome: Literal["delivered", "kept", "duplicate"]
    turn_id: str | None = None
    call_id: str | None = None
    resume: bool = False
    kept: int = 0


@dataclass(frozen=True)
class SignalKick:
    """The turn a signal's kick is for, and the agent its record names (None: not read,
    or none)."""

    turn_id: str
    agent: str | None = None


class SignalsMixin(ProtocolBase):
    """``send_signal`` (``send_signal_routed``)."""

    async def send_signal(
        self,
        cid: str,
        name: str,
        payload: str,
        *,
        signal_id: str | None = None,
        by: str | None = None,
        max_kept: int,
        ttl_ms: int,
    ) -> Signalled:
        """Deliver signal ``name`` (``payload``: the JSON text the waiting call's result
        becomes) to the conversation's turn waiting for it, or keep it for the next wait.
        ``signal_id``: the same id sent again writes nothing (None: a new one).

        Raises:
            SignalBacklogFullError: ``max_kept`` live signals of that name are kept.
        """
        sent, _ = await self.send_signal_routed(
            cid, name, payload, signal_id=signal_id, by=by, max_kept=max_kept, ttl_ms=ttl_ms
        )
        return sent

    async def send_signal_routed(
        self,
        cid: str,
        name: str,
        payload: str,
        *,
        signal_id: str | None = None,
        by: str | None = None,
        max_kept: int,
        ttl_ms: int,
    ) -> tuple[Signalled, SignalKick | None]:
        """:meth:`send_signal`, with the kick it owes, read in the same call: the turn
        it resumes (delivered, the last missing decision), or for a duplicate the inbox
        head (a resend may have lost the first answer and its kick); None: no kick."""
        check_signal_name(name)
        sid = signal_id or uuid.uuid4().hex
        inbox = self.keys.inbox(cid)
        head = await self.redis.lindex(inbox, 0)
        tid = head.decode() if isinstance(head, bytes) else ""
        for _ in range(_HEAD_TRIES):
            args = [tid, name, payload, sid, max_kept, ttl_ms, self.events_maxlen, by or ""]
            keys = self._signal_keys(cid, tid, name)
            reply = SignalReply.parse(await self.scripts.run("signal", keys, args))
            if reply.refusal is not None:
                raise self.refusal(reply.refusal, cid, tid or None)
            if reply.status == "DELIVERED":
                kick = SignalKick(tid, reply.agent) if reply.resume else None
                return Signalled("delivered", tid, reply.call_id, resume=reply.resume), kick
            if reply.status == "KEPT":
                return Signalled("kept", kept=reply.kept), None
            if reply.status == "SEEN":
                first = SignalKick(reply.head, reply.agent) if reply.head else None
                return Signalled("duplicate"), first
            tid = reply.head
        raise UnknownTurnError(f"the inbox head of conversation {cid!r} kept moving; send again")

    def _signal_keys(self, cid: str, tid: str, name: str) -> list[str]:
        keys = self.keys
        turn = tid or _NO_TURN
        return [
            keys.inbox(cid), keys.lease(cid), keys.turn(cid, turn), keys.events(cid, turn),
            keys.signals(cid, name), keys.signals_seen(cid),
        ]  # fmt: skip

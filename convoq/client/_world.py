"""The client's side of waits for the world (:mod:`convoq.waits`): a deferred call's
result (``complete_call``) and signals (``signal``). What completes a parked turn's waits
sends its ``resume`` kick, once: a repeat (the same result again, a signal id seen
before) answers as the first did and sends nothing. The kick goes to the queue of the pool
serving the turn's agent (``CONVOQ_AGENT_POOLS``), which the script answers along."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from convoq.approvals import check_decision_note
from convoq.client._base import check_call_id, check_turn_ref
from convoq.client._control import TurnRef, kick_head
from convoq.client._kicks import Kicks
from convoq.errors import ConvoqError
from convoq.ids import check_conversation_id
from convoq.observe import tracing
from convoq.queue import routing
from convoq.redis.protocol import Signalled
from convoq.redis.roles import ClientStore
from convoq.settings import ConvoqSettings
from convoq.waits import check_signal_name, result_text

MAX_SIGNAL_ID_CHARS = 200


class WorldControl:
    """Supplies results and signals on one client's store (see ``AsyncClient``)."""

    def __init__(
        self, store: Callable[[], ClientStore], kicks: Kicks, settings: ConvoqSettings
    ) -> None:
        self._store = store
        self._kicks = kicks
        self._settings = settings

    async def complete_call(
        self, turn: TurnRef, call_id: str, result: Any, *, error: str | None, by: str | None
    ) -> Literal["resume", "pending"]:
        """Record a deferred call's result (or ``error``); resume the turn when it was
        the last call it waited for."""
        cid, tid = check_turn_ref(turn.conversation_id, turn.turn_id)
        check_call_id(call_id)
        _, by = check_decision_note(None, by)
        if error is not None and (result is not None or not isinstance(error, str) or not error):
            raise ConvoqError(
                "give either a result or an error (a non-empty str the model reads), not both",
                field="error",
            )
        text = error if error is not None else result_text(result)
        decided = await self._store().record_decision(
            cid, tid, call_id=call_id, approved=True, by=by, kind="result",
            result=text, is_error=error is not None,
        )  # fmt: skip
        if decided.outcome == "resume" and not decided.repeated:
            await self._resume(cid, tid, decided.agent)
        return decided.outcome

    async def signal(
        self, conversation_id: str, name: str, payload: Any, *, signal_id: str | None,
        by: str | None,
    ) -> Signalled:  # fmt: skip
        """Deliver a signal to the conversation's turn waiting for it, or keep it."""
        cid = check_conversation_id(conversation_id)
        check_signal_name(name)
        _, by = check_decision_note(None, by)
        if signal_id is not None and (
            not isinstance(signal_id, str) or not 0 < len(signal_id) <= MAX_SIGNAL_ID_CHARS
        ):
            raise ConvoqError(
                f"signal_id must be a str of 1 to {MAX_SIGNAL_ID_CHARS} characters",
                field="signal_id",
            )
        text = result_text(payload, "payload")
        settings = self._settings
        store = self._store()
        sent, kick = await store.send_signal_routed(
            cid, name, text, signal_id=signal_id, by=by,
            max_kept=settings.signal_max_kept, ttl_ms=settings.signal_ttl_s * 1000,
        )  # fmt: skip
        if sent.resume and kick is not None:
            await self._resume(cid, kick.turn_id, kick.agent)
        elif sent.outcome == "duplicate" and kick is not None:
            # A resend may have lost the first answer and its kick; a kick more is harmless.
            await kick_head(self._kicks, store, cid, kick.turn_id, kick.agent)
        return sent

    async def _resume(self, cid: str, tid: str, agent: str | None) -> None:
        attributes = {"convoq.conversation_id": cid, "convoq.turn_id": tid}
        with tracing.span("convoq.resume", attributes):  # the resume kick's trace
            await self._kicks.send(routing.RESUME_TASK, cid, tid, agent=agent)

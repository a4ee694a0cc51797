"""The continuation of a turn on the in-process :class:`~convoq.agent.Agent`: the one a
turn starts with, the paused one an ``awaiting_approval`` Response carries (with when its
approval expires), and a resume's decisions and expiry, checked before the conversation is
claimed again. No I/O: :mod:`convoq._agent_turns` reserves, parks and frees conversations.
"""

from __future__ import annotations

import secrets
from typing import Any

from convoq import defaults
from convoq._agent_options import Asked
from convoq.agent_response import Continuation, Response, parse_decision
from convoq.approvals import check_decision_note
from convoq.engine import Paused
from convoq.errors import ConvoqError, InvalidMessageError
from convoq.ids import check_conversation_id
from convoq.memory._reservations import now_ms
from convoq.messages import GenerationRequest, Message, coerce_user_message
from convoq.turn_state import Decision, TurnState
from convoq.usage import turn_usage
from convoq.waits import result_text, wait_data, wait_ttl_ms
from convoq.window import Window

AgentInput = str | Message | GenerationRequest


def opening(
    input: AgentInput,
    *,
    conversation_id: str | None,
    agent: str | None,
    has_memory: bool,
    window: Window,
    asked: Asked,
    metadata: dict[str, Any],
) -> Continuation:
    """The continuation a new turn starts with. A GenerationRequest is sent as given:
    memory is neither read nor written. ``conversation_id``: the call's, else the agent's.

    Raises:
        InvalidMessageError: an empty GenerationRequest, or an input of another type.
        InvalidConversationIdError: the conversation id is malformed.
    """
    if isinstance(input, GenerationRequest):
        if not input.messages:
            raise InvalidMessageError("a GenerationRequest needs messages", rule="non_empty")
        return Continuation(
            token=_token(), uses_memory=False, history=input.messages[:-1],
            state=TurnState.start(input.messages[-1]), agent=agent,
            output=asked.spec, model_settings=asked.settings, metadata=metadata,
        )  # fmt: skip
    if not isinstance(input, str | Message):
        raise InvalidMessageError(
            f"expected a str, a user Message or a GenerationRequest, got {type(input).__name__}",
            rule="type",
        )
    message = coerce_user_message(input)
    if conversation_id is not None:
        check_conversation_id(conversation_id)
    return Continuation(
        token=_token(), conversation_id=conversation_id, agent=agent,
        keep_last_turns=window.keep_last_turns or 0, max_history_tokens=window.max_tokens,
        uses_memory=has_memory and conversation_id is not None,
        state=TurnState.start(message), output=asked.spec, model_settings=asked.settings,
        metadata=metadata,
    )  # fmt: skip


def decide(cont: Continuation, decisions: dict[str, Any], by: str | None) -> None:
    """Record ``decisions`` (``{call_id: True, False or a Decision}``) in the paused turn,
    stamped with who decided and when, unless its approval has expired. A call that
    waits for the world (:mod:`convoq.waits`) takes its result (or the signal's payload)
    instead: any JSON value, or a Decision with ``result`` and ``is_error``.

    Raises:
        ConvoqError: a malformed decision, result or ``by``, or the approval expired.
    """
    by = check_decision_note(None, by)[1]
    at_ms = now_ms()
    for call_id, value in decisions.items():
        if call_id in cont.state.waits and not isinstance(value, Decision):
            value = Decision(approved=True, result=result_text(value))
        cont.state.decide(call_id, parse_decision(value, by=by, at_ms=at_ms))
    if cont.expires_ms is not None and now_ms() >= cont.expires_ms:
        raise ConvoqError(
            "this continuation's approval expired (approval_ttl_s); nothing of its turn"
            " was stored: start the turn again",
            conversation_id=cont.conversation_id,
        )


def approval_ttl(approval_ttl_s: float | None) -> float:
    """How long a turn parked in process waits for its decisions (the agent's ttl, else
    the default)."""
    return defaults.APPROVAL_TTL_S if approval_ttl_s is None else approval_ttl_s


def valid_until(cont: Continuation, ttl_s: float) -> int:
    """Until when a continuation's token must be remembered as spent (unix ms)."""
    if cont.expires_ms is not None:
        return cont.expires_ms
    return now_ms() + int(ttl_s * 1000)


def held_s(cont: Continuation, ttl_s: float) -> float:
    """How long a parked continuation holds its conversation: until it expires (a call's
    deadline may come before the approval ttl ``ttl_s``)."""
    if cont.expires_ms is None:
        return ttl_s
    return max(0.001, (cont.expires_ms - now_ms()) / 1000)


def parked(cont: Continuation, outcome: Paused, ttl_s: float) -> Continuation:
    """The continuation of a turn that paused: its state so far, expiring ``ttl_s`` from
    now, or at the shortest deadline of the calls that wait for the world (the
    conversation stays reserved until then)."""
    expires = now_ms() + wait_ttl_ms(outcome.state, int(ttl_s * 1000))
    return cont.model_copy(update={"state": outcome.state, "expires_ms": expires})


def awaiting_approval(cont: Continuation) -> Response:
    """The ``awaiting_approval`` Response that hands out the parked continuation ``cont``
    (``waiting`` when every call waits for the world, none for a person)."""
    state = cont.state
    world = [c for c in state.undecided if c.id in state.waits]
    person = [c for c in state.undecided if c.id not in state.waits]
    return Response(
        text="", turn=list(state.messages), status="awaiting_approval" if person else "waiting",
        waiting_for=[wait_data(c, state.waits[c.id]) for c in world],
        conversation_id=cont.conversation_id, pending_approvals=person,
        continuation=cont, usage=turn_usage(cont.state.messages[1:], requests=cont.state.steps),
    )  # fmt: skip


def _token() -> str:
    return secrets.token_hex(16)

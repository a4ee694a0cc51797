"""Waits for the world over HTTP (:mod:`convoq.waits`): a deferred call's result, and a
conversation's signals. Both take the ``submit`` scope (what the systems that queue turns
hold: a result or a signal comes from such a system, not from a person's approval) and
answer as ``AsyncClient.complete_call`` / ``AsyncClient.signal`` do."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from convoq.gateway.auth import Access, Principal
from convoq.gateway.bodies import GatewayRoute
from convoq.gateway.document import KEYED, errors
from convoq.gateway.inputs import CallId, Cid, Tid
from convoq.gateway.models import TurnView
from convoq.gateway.problems import GatewayError
from convoq.gateway.routes_turns import AppClient
from convoq.waits import MAX_SIGNAL_NAME_CHARS

router = APIRouter(
    prefix="/v1/conversations/{cid}",
    tags=["waits"],
    route_class=GatewayRoute,
    responses=errors(*KEYED),
)


# No control characters (a name and a sender are shown to operators).
_PRINTABLE = r"^[^\x00-\x1f\x7f]+$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CallResult(_Strict):
    """The result of a deferred tool call: any JSON (a string reads as it is)."""

    result: Any = Field(description="What the model reads as the call's result.")
    by: str | None = Field(
        default=None, min_length=1, max_length=200, pattern=_PRINTABLE,
        description="Who sent it, for keys allowed to say (may_set_by); else the key's name.",
    )  # fmt: skip


class CallError(_Strict):
    """A deferred tool call failed: ``error`` is what the model reads."""

    error: str = Field(min_length=1, max_length=100_000, description="Why the call failed.")
    by: str | None = Field(
        default=None, min_length=1, max_length=200, pattern=_PRINTABLE,
        description="Who sent it, for keys allowed to say (may_set_by); else the key's name.",
    )  # fmt: skip


class CallResultAnswer(BaseModel):
    """``resume``: it was the last call the turn waited for, the turn goes on on a worker;
    ``pending``: other calls still wait. ``turn``: as it stands after the result."""

    outcome: Literal["resume", "pending"]
    turn: TurnView


class SignalRequest(_Strict):
    """A signal for the turn of this conversation that waits for ``name``."""

    name: str = Field(min_length=1, max_length=MAX_SIGNAL_NAME_CHARS, pattern=_PRINTABLE)
    payload: Any = Field(default=None, description="What the waiting call's result becomes.")
    signal_id: str | None = Field(
        default=None, min_length=1, max_length=200,
        description="The same id again is a duplicate that changes nothing (a webhook's id).",
    )  # fmt: skip


class SignalAnswer(BaseModel):
    """``delivered`` (to ``call_id`` of ``turn_id``; ``resume``: the turn goes on),
    ``kept`` (for the next wait on that name; ``kept`` of them now) or ``duplicate``."""

    outcome: Literal["delivered", "kept", "duplicate"]
    turn_id: str | None = None
    call_id: str | None = None
    resume: bool = False
    kept: int = 0


def _by(body_by: str | None, principal: Principal) -> str:
    if body_by is not None and not principal.may_set_by:
        raise GatewayError(
            403, "Forbidden", "this API key may not name who sent it (by); leave it out"
        )
    return body_by or principal.name


@router.post(
    "/turns/{tid}/calls/{call_id}/result",
    response_model=CallResultAnswer,
    summary="Supply a deferred tool call's result (scope: submit)",
    responses=errors(404, 409),
)
async def complete_call(
    cid: Cid,
    tid: Tid,
    call_id: CallId,
    body: CallResult | CallError,
    client: AppClient,
    principal: Annotated[Principal, Depends(Access("submit"))],
) -> CallResultAnswer:
    """Record the result (``{"result": ...}``) or the error (``{"error": "..."}``) of a
    call whose tool raised CallDeferred; once every call the turn waits for has its
    answer it resumes on a worker. The same result again answers as the first did and
    changes nothing; another result for that call, a result after the call's deadline,
    or one for a call that waits for something else is a 409."""
    handle = client.handle(cid, tid)
    by = _by(body.by, principal)
    if isinstance(body, CallError):
        outcome = await client.complete_call(handle, call_id, error=body.error, by=by)
    else:
        outcome = await client.complete_call(handle, call_id, body.result, by=by)
    return CallResultAnswer(outcome=outcome, turn=TurnView.of(await handle.record()))


@router.post(
    "/signals",
    response_model=SignalAnswer,
    summary="Send a signal to the conversation (scope: submit)",
    responses=errors(429),
)
async def send_signal(
    cid: Cid,
    body: SignalRequest,
    client: AppClient,
    principal: Annotated[Principal, Depends(Access("submit"))],
) -> SignalAnswer:
    """Deliver the signal to the conversation's turn waiting for ``name`` (it resumes),
    or keep it for the next wait on that name (bounded: a 429 when as many are kept as
    allowed)."""
    sent = await client.signal(
        cid, body.name, body.payload, signal_id=body.signal_id, by=principal.name
    )
    return SignalAnswer(
        outcome=sent.outcome, turn_id=sent.turn_id, call_id=sent.call_id, resume=sent.resume,
        kept=sent.kept,
    )  # fmt: skip

"""``/v1/conversations/{cid}/turns``: submit, read, follow, decide, cancel, discard, retry."""

from __future__ import annotations

import contextlib
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from convoq.client import AsyncClient
from convoq.errors import ConversationBusyError, TurnTimeoutError
from convoq.gateway.auth import Access, Principal
from convoq.gateway.bodies import GatewayRoute, submit_body, turn_body
from convoq.gateway.document import KEYED, errors
from convoq.gateway.inputs import (
    EVENT_ID,
    NOT_NULL,
    CallId,
    Cid,
    DecisionRequest,
    Tid,
    TurnRequest,
)
from convoq.gateway.models import (
    CancelResult,
    DecisionResult,
    TurnAccepted,
    TurnLinks,
    TurnView,
)
from convoq.gateway.problems import GatewayError
from convoq.gateway.sse import check_event_id, turn_events
from convoq.ids import check_conversation_id

router = APIRouter(
    prefix="/v1/conversations/{cid}/turns",
    tags=["turns"],
    route_class=GatewayRoute,
    responses=errors(*KEYED),
)
MAX_WAIT_S = 60.0
# Documented here, checked by check_event_id (whose 422 names the header).
_EVENT_ID: dict[str, Any] = {"pattern": EVENT_ID}

# OpenAPI links (operation ids are the routes' names, see create_app): a submit's answer
# and a turn's view both name the turn this way, so a client (or a fuzzer's stateful
# phase) follows them to what it can do next.
_THE_TURN = {"path.cid": "$response.body#/conversation_id", "path.tid": "$response.body#/turn_id"}


def _link(operation: str, **parameters: Any) -> dict[str, Any]:
    return {"operationId": operation, "parameters": {**_THE_TURN, **parameters}}


_LOCATION = {
    "schema": {"type": "string"},
    "required": True,
    "description": "The turn's URL (links.self).",
}
_SUBMITTED: dict[str, Any] = {
    "headers": {"Location": _LOCATION},
    "links": {
        # Until settled: the answer comes once the turn is final, parked for approval or
        # scheduled (waiting for its time).
        "Turn": _link("get_turn", **{"query.wait": 10, "query.until": "settled"}),
        "Events": _link("turn_events_sse", **{"query.until": "settled"}),
        "Cancel": _link("cancel"),
    },
}
_VIEWED: dict[str, Any] = {
    "links": {
        "DecidePending": _link(
            "decide", **{"path.call_id": "$response.body#/pending_approvals/0/id"}
        ),
        "Discard": _link("discard"),
        # A failed turn (status "failed") runs again as the same turn.
        "Retry": _link("retry"),
    }
}


def client_of(request: Request) -> AsyncClient:
    client: AsyncClient = request.app.state.client
    return client


# The application's one AsyncClient, injected into each route (not convoq.Client).
AppClient = Annotated[AsyncClient, Depends(client_of)]


def turns_url(request: Request, cid: str) -> str:
    """The URL of a conversation's turns, the id percent-encoded (every byte of a link is
    ASCII, so the ``Location`` header cannot fail to encode after the turn is queued)."""
    check_conversation_id(cid)
    return str(request.url_for("submit_turn", cid=quote(cid, safe="")))


def _links(turns: str, tid: str) -> TurnLinks:
    base = f"{turns}/{quote(tid, safe='')}"
    return TurnLinks(
        self=base, events=f"{base}/events", cancel=f"{base}/cancel", retry=f"{base}/retry"
    )


@router.post(
    "",
    status_code=202,
    response_model=TurnAccepted,
    openapi_extra=submit_body(),
    summary="Queue a turn (scope: submit)",
    responses={202: _SUBMITTED, **errors(409, 415, 429)},
)
async def submit_turn(
    cid: Cid,
    request: Request,
    response: Response,
    client: AppClient,
    _: Annotated[Principal, Depends(Access("submit"))],
    idempotency_key: Annotated[str | None, NOT_NULL, Header(min_length=1, max_length=256)] = None,
) -> TurnAccepted:
    """Queue a turn and answer at once (202) with its id and URLs. JSON body, or
    multipart/form-data with ``text`` and files (images become image parts, anything else
    file parts). ``Idempotency-Key``: a repeat of the same request answers with the first
    turn as it stands now; the key reused for another request is a 409 naming what
    differs. Over a limit on queued turns (``CONVOQ_MAX_QUEUED_*``): 429 with
    ``Retry-After``, nothing queued."""
    turns = turns_url(request, cid)  # everything that can fail comes before the write
    body, message = await turn_body(request)
    try:
        handle = await client.submit(
            cid,
            message,
            agent=body.agent,
            idempotency_key=idempotency_key,
            keep_last_turns=body.keep_last_turns,
            max_history_tokens=body.max_history_tokens,
            callback_url=body.callback_url,
            if_busy=body.if_busy,
            metadata=body.metadata,  # a JSON field, or a multipart field's JSON
            not_before=body.not_before,
            delay_s=body.delay_s,
            # Settings and an output schema come in a JSON body only.
            **(body.asked() if isinstance(body, TurnRequest) else {}),
        )
    except ConversationBusyError as busy:
        raise ConversationBusyError(
            f"conversation {cid!r} has a turn in progress and the request said"
            ' "if_busy": "reject": wait for it, or send "if_busy": "queue" to line up behind',
            **busy.details,
        ) from None
    # A repeat (same Idempotency-Key) reports the first turn as it stands now; so does a
    # message merged into a queued turn (the turn that answers it).
    scheduled = body.not_before is not None or body.delay_s is not None
    repeated = handle.repeated or handle.merged_from
    status = await handle.status() if repeated else "scheduled" if scheduled else "queued"
    links = _links(turns, handle.turn_id)
    response.headers["Location"] = links.self
    return TurnAccepted(
        conversation_id=handle.conversation_id,
        turn_id=handle.turn_id,
        status=status,
        links=links,
        merged_from=handle.merged_from,
    )


@router.get(
    "/{tid}",
    response_model=TurnView,
    summary="A turn's status and result (scope: read)",
    responses={200: _VIEWED, **errors(404)},
)
async def get_turn(
    cid: Cid,
    tid: Tid,
    client: AppClient,
    _: Annotated[Principal, Depends(Access("read"))],
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="Long-poll seconds")] = 0,
    until: Annotated[
        Literal["settled", "final"],
        Query(description="With wait: settled (final, parked for approval or scheduled) or final"),
    ] = "settled",
) -> TurnView:
    """The turn as it stands. ``?wait=N``: answer once it is final, parked for approval
    or scheduled (``until=final``: only once final), or after N seconds with where it
    stands then."""
    handle = client.handle(cid, tid)
    if wait > 0:
        # Timed out: answered with the turn as it stands.
        with contextlib.suppress(TurnTimeoutError):
            await handle.wait(wait, raise_on_error=False, until=until)
    return TurnView.of(await handle.record())


@router.get(
    "/{tid}/events",
    summary="The turn's events as Server-Sent Events (scope: read)",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **errors(404)},
)
async def turn_events_sse(
    cid: Cid,
    tid: Tid,
    client: AppClient,
    _: Annotated[Principal, Depends(Access("read"))],
    last_event_id: Annotated[
        str | None, NOT_NULL, Header(max_length=64, json_schema_extra=_EVENT_ID)
    ] = None,
    after: Annotated[
        str | None,
        NOT_NULL,
        Query(max_length=64, description="As Last-Event-ID", json_schema_extra=_EVENT_ID),
    ] = None,
    until: Annotated[
        Literal["settled", "final"],
        Query(
            description="final: end after done; settled: also once parked for approval or scheduled"
        ),
    ] = "final",
) -> StreamingResponse:
    """Every event of the turn (status, text deltas, tool calls, approvals, done), from
    the start or after ``Last-Event-ID``; the stream ends after ``done`` (``until=settled``:
    also at its ``awaiting_approval`` status while the turn is still parked for approval,
    and at its ``scheduled`` status while it waits for its time)."""
    # Both are checked whichever is used: a bad one is refused, never ignored.
    given = check_event_id(after)
    start = check_event_id(last_event_id) if last_event_id is not None else given
    handle = client.handle(cid, tid)
    await handle.record()  # 404 before the stream starts
    return StreamingResponse(
        turn_events(handle, start, settled=until == "settled"),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@router.post(
    "/{tid}/approvals/{call_id}",
    response_model=DecisionResult,
    summary="Approve or deny a pending tool call (scope: approve)",
    responses=errors(404, 409, 415),
)
async def decide(
    cid: Cid,
    tid: Tid,
    call_id: CallId,
    body: DecisionRequest,
    client: AppClient,
    principal: Annotated[Principal, Depends(Access("approve"))],
) -> DecisionResult:
    """Record the decision, with who decided (the API key's name, or ``by`` for a key
    allowed to name someone) and when; once every pending call is decided the turn
    resumes on a worker (``outcome`` "resume"). Answers with the turn as it stands after
    the decision. The same decision again (a retry after a lost answer) answers as the
    first did and changes nothing; another decision on a decided call is a 409."""
    if body.by is not None and not principal.may_set_by:
        raise GatewayError(
            403, "Forbidden", "this API key may not name who decided (by); leave it out"
        )
    by = body.by or principal.name
    handle = client.handle(cid, tid)
    if body.decision == "approve":
        outcome = await client.approve(handle, call_id, by=by, reason=body.reason)
    else:
        outcome = await client.deny(handle, call_id, reason=body.reason, by=by)
    turn = TurnView.of(await handle.record())
    return DecisionResult(outcome=outcome, turn=turn, decision=turn.decisions.get(call_id))


@router.post(
    "/{tid}/cancel",
    response_model=CancelResult,
    summary="Cancel a turn (scope: submit)",
    responses=errors(404, 409),
)
async def cancel(
    cid: Cid, tid: Tid, client: AppClient, _: Annotated[Principal, Depends(Access("submit"))]
) -> CancelResult:
    """Queued or parked: cancelled at once. Running: it stops at its next step
    ("stopping"). Already final: "finished"."""
    return CancelResult(outcome=await client.cancel(client.handle(cid, tid)))


@router.post(
    "/{tid}/retry",
    status_code=202,
    response_model=TurnAccepted,
    summary="Run a failed turn again, as the same turn (scope: submit)",
    # Its answer names the turn's URLs as a submit's does (no OpenAPI links: a fuzzer's
    # stateful phase reaches a failed turn too seldom to follow them).
    responses={202: {"headers": {"Location": _LOCATION}}, **errors(404, 409, 429)},
)
async def retry(
    cid: Cid,
    tid: Tid,
    request: Request,
    response: Response,
    client: AppClient,
    _: Annotated[Principal, Depends(Access("submit"))],
    idempotency_key: Annotated[str | None, NOT_NULL, Header(min_length=1, max_length=256)] = None,
) -> TurnAccepted:
    """Queue a failed turn again as the same turn, at the back of its conversation's line
    (its answer comes after the turns submitted since): its journal is kept, so the steps
    it finished are not run again and its tools keep their idempotency keys. A turn that
    did not fail is a 409 naming its status (nothing changed). ``Idempotency-Key``: the
    same request again (after a lost answer) answers as the first, with the turn as it
    stands now; without one, a second retry of a turn queued again is a 409."""
    turns = turns_url(request, cid)
    handle = await client.retry(client.handle(cid, tid), idempotency_key=idempotency_key)
    status = await handle.status() if handle.repeated else "queued"
    links = _links(turns, tid)
    response.headers["Location"] = links.self
    return TurnAccepted(conversation_id=cid, turn_id=tid, status=status, links=links)


@router.post(
    "/{tid}/discard",
    status_code=204,
    summary="Discard a parked turn (scope: approve)",
    responses=errors(404, 409),
)
async def discard(
    cid: Cid, tid: Tid, client: AppClient, _: Annotated[Principal, Depends(Access("approve"))]
) -> Response:
    """End a turn awaiting approval as cancelled; nothing is stored, later turns run. The
    turn stays readable (status "cancelled"): this ends it, it does not delete it."""
    await client.discard(client.handle(cid, tid), reason="discarded through the gateway")
    return Response(status_code=204)

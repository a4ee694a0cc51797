"""Conversations as a whole (history, scheduled turns, delete) and the approvals waiting
across them."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response
from pydantic_core import to_json

from convoq.errors import ConversationBusyError
from convoq.gateway.auth import Access, Principal
from convoq.gateway.bodies import GatewayRoute
from convoq.gateway.document import KEYED, errors
from convoq.gateway.inputs import NOT_NULL, Cid
from convoq.gateway.models import Approval, Approvals, History, Scheduled, ScheduledView
from convoq.gateway.routes_turns import AppClient
from convoq.usage import Usage

router = APIRouter(tags=["conversations"], route_class=GatewayRoute, responses=errors(*KEYED))


@router.get(
    "/v1/conversations/{cid}/messages",
    response_model=History,
    summary="A conversation's stored messages, paged (scope: read)",
)
async def messages(
    cid: Cid,
    client: AppClient,
    _: Annotated[Principal, Depends(Access("read"))],
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    last_turns: Annotated[
        int | None, NOT_NULL, Query(ge=1, description="Only the last N turns")
    ] = None,
) -> Response:
    """Messages oldest first (attachments as base64): ``limit`` of them from ``offset``.
    The stored JSON goes out as it is stored: no message is decoded on the way but those
    with attachments and those a page boundary cuts (:mod:`convoq.redis._raw`)."""
    stored = await client.protocol.history_json(cid, last_turns=last_turns)
    head = to_json(cid)
    page = stored.array(offset, limit)
    body = b'{"conversation_id":%s,"messages":%s,"offset":%d,"total":%d}' % (
        head,
        page,
        offset,
        stored.total,
    )
    return Response(content=body, media_type="application/json")


@router.get(
    "/v1/conversations/{cid}/usage",
    response_model=Usage,
    summary="Tokens a conversation's stored turns reported, summed (scope: read)",
)
async def usage(
    cid: Cid, client: AppClient, _: Annotated[Principal, Depends(Access("read"))]
) -> Usage:
    """One read of the counters each commit adds to, whatever the history's length."""
    return await client.usage(cid)


@router.get(
    "/v1/conversations/{cid}/scheduled",
    response_model=Scheduled,
    summary="A conversation's scheduled turns, earliest first (scope: read)",
)
async def scheduled(
    cid: Cid,
    client: AppClient,
    _: Annotated[Principal, Depends(Access("read"))],
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Scheduled:
    """The turns submitted with ``not_before`` or ``delay_s`` that still wait for their
    time (``limit`` of them); cancel one with its turn's cancel route."""
    waiting = await client.scheduled(cid, limit=limit)
    turns = [ScheduledView.of(s) for s in waiting]
    return Scheduled(conversation_id=cid, now_ms=int(time.time() * 1000), turns=turns)


@router.delete(
    "/v1/conversations/{cid}",
    status_code=204,
    summary="Delete a conversation (scope: admin)",
    responses=errors(409),
)
async def delete_conversation(
    cid: Cid,
    client: AppClient,
    _: Annotated[Principal, Depends(Access("admin"))],
    force: Annotated[bool, Query(description="Also while turns are queued or running")] = False,
) -> Response:
    """Every key of the conversation goes (409 while a turn is in progress, unless
    ``?force=true``)."""
    try:
        await client.clear(cid, force=force)
    except ConversationBusyError as busy:
        raise ConversationBusyError(
            f"conversation {cid!r} has turns queued, running or awaiting approval: wait for"
            " them, cancel them, or delete with ?force=true",
            **busy.details,
        ) from None
    return Response(status_code=204)


@router.get(
    "/v1/approvals",
    response_model=Approvals,
    tags=["approvals"],
    summary="Turns awaiting approval, newest first (scope: approve)",
)
async def approvals(
    client: AppClient,
    principal: Annotated[Principal, Depends(Access("approve"))],
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> Approvals:
    """What the approvals inbox shows: the parked turns the key may reach (its
    conversation prefix), with their pending tool calls and when their approvals expire;
    ``limit`` of them from ``offset``, and ``next_offset`` while more follow."""
    parked = await client.awaiting_approval(
        limit=limit + 1, offset=offset, conversation_prefix=principal.conversation_prefix
    )
    more = len(parked) > limit
    return Approvals(
        now_ms=int(time.time() * 1000),
        turns=[Approval.of(p) for p in parked[:limit]],
        next_offset=offset + limit if more else None,
    )

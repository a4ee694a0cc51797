"""What the console's pages read (:mod:`.console`), as JSON routes of the API: the calling
key, conversations and one conversation (overview, transcript, attachments, turns), a
turn's timeline, and the workers with the backlog of each partition.

Each route has the scope and prefix checks of every route here (:class:`Access`; a
conversation outside the key's prefix is a 403), and what spans conversations (the list,
the backlog, the turns a worker runs) holds only those the key may reach. Lists come from
bounded SCANs (:mod:`convoq.redis._browse` says why, and what the bound means).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from convoq.client import AsyncClient
from convoq.errors import UnknownTurnError
from convoq.gateway.auth import Access, Principal
from convoq.gateway.bodies import GatewayRoute
from convoq.gateway.console_models import (
    ConversationList,
    ConversationRow,
    ConversationView,
    KeyInfo,
    LeaseView,
    SummaryView,
    Transcript,
    TurnDetail,
    TurnList,
    TurnRow,
)
from convoq.gateway.document import KEYED, errors
from convoq.gateway.inputs import NOT_NULL, TURN_ID, Cid, Tid
from convoq.gateway.models import ChildTurnView, ParentCallView
from convoq.gateway.problems import GatewayError
from convoq.gateway.routes_turns import AppClient
from convoq.gateway.timeline import priced, timeline
from convoq.pricing import PriceTable
from convoq.redis._browse import Browse
from convoq.redis._inspect import Glance, Inspect, TurnBrief
from convoq.redis._records import TurnRecord
from convoq.redis._transcript import Transcript as StoredTranscript
from convoq.subagents import ParentCall, child_ids, children_of_result
from convoq.usage import Usage

router = APIRouter(tags=["console"], route_class=GatewayRoute, responses=errors(*KEYED))
Reader = Annotated[Principal, Depends(Access("read"))]
# An id's start: what a conversation id may hold (no control characters), or nothing.
ID_PREFIX = r"^[^\x00-\x1f\x7f-\x9f]{0,256}$"
SHA256 = r"^[0-9a-f]{64}$"


def within(principal: Principal, asked: str) -> str | None:
    """The id prefix to look under: ``asked`` narrowed to the key's prefix, or None when
    the two exclude each other (nothing the key may reach starts with ``asked``)."""
    own = principal.conversation_prefix
    if asked.startswith(own):
        return asked
    return own if own.startswith(asked) else None


def prices_of(request: Request) -> PriceTable:
    """The deployment's price table (``CONVOQ_MODEL_PRICES``; empty: tokens only)."""
    prices: PriceTable = request.app.state.prices
    return prices


Prices = Annotated[PriceTable, Depends(prices_of)]


def _store(client: AsyncClient) -> tuple[Browse, Inspect]:
    store = client.protocol
    return Browse(store.redis, store.keys), Inspect(store.redis, store.keys)


@router.get(
    "/v1/key",
    response_model=KeyInfo,
    summary="The calling API key: its name, scopes and conversation prefix (any scope)",
)
async def key_info(principal: Annotated[Principal, Depends(Access(None))]) -> KeyInfo:
    """What the console shows and offers depends on it (a button for what the key may do)."""
    return KeyInfo(
        name=principal.name,
        scopes=sorted(principal.scopes),
        conversation_prefix=principal.conversation_prefix,
        may_set_by=principal.may_set_by,
    )


@router.get(
    "/v1/conversations",
    response_model=ConversationList,
    summary="Conversations, latest turn first (scope: read)",
)
async def conversations(
    client: AppClient,
    principal: Reader,
    prefix: Annotated[
        str, Query(pattern=ID_PREFIX, description="Only ids starting with it (within the key's).")
    ] = "",
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> ConversationList:
    """The conversations the key may reach whose id starts with ``prefix``, the one with
    the newest turn first: what each stores, what waits in its inbox, whether a turn runs
    or awaits approval, and its latest turn. Found by a bounded SCAN (``complete`` false:
    the scan stopped at its bound; narrow the prefix)."""
    under = within(principal, prefix)
    if under is None:
        return ConversationList(conversations=[], found=0, complete=True)
    browse, inspect = _store(client)
    scan = await browse.conversations(under)
    ordered = sorted(
        ((max(seen.turn_ids, default=""), cid) for cid, seen in scan.found.items()), reverse=True
    )[:limit]
    cids = [cid for _, cid in ordered]
    glances = await inspect.glances(cids)
    latest = {b.conversation_id: b for b in await inspect.briefs([(c, t) for t, c in ordered if t])}
    rows = [_row(cid, seen, latest.get(cid)) for cid, seen in zip(cids, glances, strict=True)]
    return ConversationList(conversations=rows, found=len(scan.found), complete=scan.complete)


def _row(cid: str, seen: Glance, brief: TurnBrief | None) -> ConversationRow:
    times = (
        [t for t in (brief.finished_ms, brief.started_ms, brief.created_ms) if t] if brief else []
    )
    return ConversationRow(
        conversation_id=cid,
        stored_turns=seen.stored_turns,
        queued=seen.inbox_length - (1 if seen.running or seen.parked else 0),
        running=seen.running,
        parked=seen.parked,
        latest_turn=TurnRow.of(brief) if brief else None,
        activity_ms=max(times) if times else None,
    )


@router.get(
    "/v1/conversations/{cid}",
    response_model=ConversationView,
    summary="A conversation now: stored turns, usage, summary, inbox, lease (scope: read)",
)
async def conversation(cid: Cid, client: AppClient, prices: Prices, _: Reader) -> ConversationView:
    """What the conversation's keys hold now (all zero for one that holds nothing)."""
    inspect = _store(client)[1]
    seen = await inspect.overview(cid)
    inbox = await inspect.briefs([(cid, tid) for tid in seen.inbox])
    summary = (
        SummaryView(text=seen.summary, watermark=seen.summary_watermark)
        if seen.summary is not None
        else None
    )
    return ConversationView(
        conversation_id=cid,
        stored_turns=seen.stored_turns,
        stored_bytes=seen.stored_bytes,
        stored_elements=seen.stored_elements,
        usage=seen.usage,
        usage_by_model=seen.usage_by_model,
        cost=prices.cost(seen.usage_by_model) if prices else None,
        summary=summary,
        inbox=[TurnRow.of(b) for b in inbox],
        inbox_length=seen.inbox_length,
        lease=LeaseView.of(seen.lease),
    )


@router.get(
    "/v1/conversations/{cid}/transcript",
    response_model=Transcript,
    summary="A conversation's stored turns, newest first, attachments by reference (scope: read)",
)
async def transcript(
    cid: Cid,
    client: AppClient,
    _: Reader,
    before: Annotated[
        int | None,
        NOT_NULL,
        Query(ge=1, le=1_000_000_000, description="The next_before of the page before."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200, description="Stored elements per page.")] = 20,
) -> Transcript:
    """A page of the stored history, newest turn first: each message as stored, its
    attachments named by SHA-256 with their type, name and size (GET
    ``.../attachments/{sha256}`` answers the bytes). A page reads only its own stored
    elements, whatever the history's length."""
    store = client.protocol
    page = await StoredTranscript(store.redis, store.keys).page(cid, before=before, limit=limit)
    return Transcript.model_validate(
        {
            "conversation_id": cid,
            "total": page.total,
            "turns": [{"index": t.index, "messages": t.messages} for t in page.turns],
            "next_before": page.next_before,
            "lead": page.lead,
        }
    )


@router.get(
    "/v1/conversations/{cid}/attachments/{sha256}",
    summary="The bytes of one of a conversation's stored attachments (scope: read)",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}, **errors(404)},
)
async def attachment(
    cid: Cid,
    sha256: Annotated[str, Path(pattern=SHA256, description="As the transcript names it.")],
    client: AppClient,
    _: Reader,
) -> Response:
    """Always ``application/octet-stream`` as a download (the transcript says its type):
    bytes a user sent are never served as a page of this origin."""
    store = client.protocol
    data = await StoredTranscript(store.redis, store.keys).attachment(cid, sha256)
    if data is None:
        raise GatewayError(404, "UnknownAttachment", "no stored attachment with that SHA-256")
    headers = {
        "Content-Disposition": f'attachment; filename="{sha256[:16]}"',
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "default-src 'none'; sandbox",
        "Cache-Control": "private, max-age=3600",
    }
    return Response(data, media_type="application/octet-stream", headers=headers)


@router.get(
    "/v1/conversations/{cid}/turns",
    response_model=TurnList,
    summary="A conversation's turns with a record, newest first (scope: read)",
)
async def turns(
    cid: Cid,
    client: AppClient,
    _: Reader,
    before: Annotated[
        str | None,
        NOT_NULL,
        Query(pattern=TURN_ID, description="The next_before of the page before."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> TurnList:
    """Its turns whose records are kept (``CONVOQ_TURN_TTL_S`` after they end), newest
    first, with their status; found by a bounded SCAN of the conversation's keys."""
    browse, inspect = _store(client)
    ids, complete = await browse.turn_ids(cid)
    older = [t for t in ids if before is None or t < before]
    page = older[:limit]
    briefs = await inspect.briefs([(cid, tid) for tid in page])
    return TurnList(
        conversation_id=cid,
        turns=[TurnRow.of(b) for b in briefs],
        total=len(ids),
        next_before=page[-1] if len(older) > limit else None,
        complete=complete,
    )


@router.get(
    "/v1/conversations/{cid}/turns/{tid}/timeline",
    response_model=TurnDetail,
    summary="A turn's steps: model calls, tool calls, approvals, takeovers (scope: read)",
    responses=errors(404),
)
async def turn_timeline(
    cid: Cid, tid: Tid, client: AppClient, prices: Prices, _: Reader
) -> TurnDetail:
    """The turn's record in brief and its steps, read from its events (see the console's
    docs for what each step carries); ``last_event_id``: follow the turn's events after it."""
    inspect = _store(client)[1]
    whole = await inspect.whole(cid, tid)
    if whole is None:
        raise UnknownTurnError(
            f"no turn {tid!r} in conversation {cid!r}: it never existed or its record expired",
            conversation_id=cid,
            turn_id=tid,
        )
    last = whole.events[-1][0] if whole.events else "0"
    steps = timeline(whole)
    detail = TurnDetail.of(whole.record, steps, last)
    detail.cost = priced(steps, prices)
    detail.parent, detail.children = await _family(inspect, whole.record)
    lease = whole.lease
    if lease is not None and lease.state == "active" and whole.inbox_head == tid:
        detail.running_on = lease.holder
    return detail


async def _family(
    inspect: Inspect, record: TurnRecord
) -> tuple[ParentCallView | None, list[ChildTurnView]]:
    """The call a child turn answers, and a turn's child turns: as its result lists them
    once final; while it waits, those of its pending calls that made one (a child's id
    derives from its parent's ids and the call, so no index is read)."""
    parent = ParentCall.of(record.options)
    parent_view = ParentCallView(**asdict(parent)) if parent is not None else None
    listed = children_of_result(record.result)
    if listed:
        return parent_view, [ChildTurnView(**asdict(child)) for child in listed]
    pending = (record.result or {}).get("pending_approvals") or []
    calls = [c["id"] for c in pending if isinstance(c, dict) and isinstance(c.get("id"), str)]
    refs = {child_ids(record.conversation_id, record.turn_id, call): call for call in calls}
    found = await inspect.briefs([(ref.conversation_id, ref.turn_id) for ref in refs])
    by_turn = {ref.turn_id: call for ref, call in refs.items()}
    return parent_view, [_child(by_turn[b.turn_id], b) for b in found]


def _child(call_id: str, brief: TurnBrief) -> ChildTurnView:
    """A child turn still in progress (its usage comes with its parent's result)."""
    return ChildTurnView(
        call_id=call_id, agent=brief.agent, conversation_id=brief.conversation_id,
        turn_id=brief.turn_id, status=brief.status, usage=Usage(),
    )  # fmt: skip

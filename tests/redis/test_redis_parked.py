"""Listing the turns that await approval across conversations (what the gateway's
approvals inbox shows), against a real redis-server."""

from __future__ import annotations

import pytest

from convoq.messages import Message, ToolCall
from convoq.redis import TurnProtocol
from convoq.turn_state import TurnState
from tests.support.protocol_helpers import submit_all

LEASE = 30_000


@pytest.fixture
def protocol_url(store_url: str) -> str:
    return store_url


async def _park(proto: TurnProtocol, cid: str, *call_ids: str, ttl_ms: int = 60_000) -> None:
    await submit_all(proto, cid, "t1")
    acquired = await proto.acquire(cid, worker_id="w1", lease_ms=LEASE)
    assert acquired is not None
    calls = [ToolCall(id=c, name="pay", arguments={"to": cid}) for c in call_ids]
    state = TurnState(
        messages=[acquired.turn.input, Message.assistant("", tool_calls=calls)],
        steps=1,
        pending=calls,
    )
    await proto.park(cid, "t1", fence=acquired.fence, state=state, approval_ttl_ms=ttl_ms)


async def test_parked_turns_newest_first_with_their_calls_and_expiry(proto: TurnProtocol) -> None:
    await _park(proto, "older", "a")
    await _park(proto, "newer", "b", "c", ttl_ms=120_000)
    await submit_all(proto, "running", "t1")
    assert await proto.acquire("running", worker_id="w1", lease_ms=LEASE) is not None
    await submit_all(proto, "queued", "t1")

    parked = await proto.parked_turns()
    assert [p.record.conversation_id for p in parked] == ["newer", "older"]
    newest = parked[0]
    assert newest.record.status == "awaiting_approval" and newest.record.agent
    calls = newest.record.result["pending_approvals"]  # type: ignore[index]
    assert [c["id"] for c in calls] == ["b", "c"]
    assert newest.parked_ms >= parked[1].parked_ms
    assert 110_000 < newest.expires_ms - newest.parked_ms <= 120_000
    assert [p.record.conversation_id for p in await proto.parked_turns(limit=1)] == ["newer"]


async def test_a_turn_leaves_the_list_once_every_call_is_decided(proto: TurnProtocol) -> None:
    await _park(proto, "two-calls", "a", "b")
    assert await proto.decide("two-calls", "t1", call_id="a", approved=True) == "pending"
    assert [p.record.turn_id for p in await proto.parked_turns()] == ["t1"]  # b still waits
    assert await proto.decide("two-calls", "t1", call_id="b", approved=False) == "resume"
    assert await proto.parked_turns() == []

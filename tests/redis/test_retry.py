"""Retrying a failed turn as the same turn, in the turn protocol against a real Redis: it
goes to the back of its conversation's inbox with its journal, its budgets afresh; a
resent request changes nothing twice; a turn that did not fail is refused, nothing
changed."""

from __future__ import annotations

import pytest
import redis

from convoq.errors import CorruptDataError, QueueFullError, TurnNotRetryableError, UnknownTurnError
from convoq.limits import QueueLimits
from convoq.messages import Message
from convoq.redis import Acquired, TurnProtocol
from convoq.redis.protocol import TurnEnding
from convoq.turn_state import TurnState
from tests.redis.test_redis_bad_input import snapshot
from tests.redis.test_redis_wrong_types import break_key
from tests.support.protocol_helpers import open_protocol, submit_all

pytestmark = pytest.mark.slowpaths

CID = "conv-retry"
LEASE = 30_000
ERROR = {"type": "ModelError", "message": "the model failed", "details": {}}


@pytest.fixture
def protocol_url(store_url: str) -> str:
    return store_url


async def take(proto: TurnProtocol, **limits: int) -> Acquired:
    acquired = await proto.acquire(CID, worker_id="w1", lease_ms=LEASE, **limits)
    assert acquired is not None
    return acquired


async def commit(proto: TurnProtocol, acquired: Acquired) -> Acquired | None:
    turn = [acquired.turn.input, Message.assistant(f"answer to {acquired.turn.input.text}")]
    return await proto.commit(CID, acquired.turn.turn_id, turn, TurnEnding(fence=acquired.fence))


async def fail_with_a_step(proto: TurnProtocol) -> tuple[Acquired | None, TurnState]:
    """t1 runs a step (journaled), then fails; the lease goes on to the turn behind it,
    handed out (or none)."""
    first = await take(proto)
    state = TurnState(messages=[first.turn.input, Message.assistant("step one")], steps=1)
    await proto.checkpoint(CID, "t1", fence=first.fence, state=state)
    ending = TurnEnding(fence=first.fence, next_turn_id=first.next_turn_id)
    return await proto.fail(CID, "t1", ERROR, ending), state


async def stored(proto: TurnProtocol) -> list[str]:
    return [m.text for m in await proto.history(CID) if m.role == "user"]


async def test_a_failed_turn_runs_again_as_itself_after_the_later_turns(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await submit_all(proto, CID, "t1", "t2")
    second, state = await fail_with_a_step(proto)
    assert store_client.pttl(proto.keys.journal(CID, "t1")) > 0  # kept, expiring
    retried = await proto.retry(CID, "t1", token="r1")
    assert (retried.status, retried.retries, retried.position) == ("queued", 1, 1)
    assert not retried.repeated
    record = await proto.get_turn(CID, "t1")
    assert (record.status, record.error, record.finished_ms, record.retries) == (
        "queued",
        None,
        None,
        1,
    )
    for key in (proto.keys.turn(CID, "t1"), proto.keys.events(CID, "t1")):
        assert store_client.pttl(key) == -1  # queued again: kept as long as it waits
    assert store_client.pttl(proto.keys.journal(CID, "t1")) == -1
    assert second is not None and second.turn.turn_id == "t2"  # t2 first: it was ahead
    again = await commit(proto, second)
    assert again is not None
    assert again.turn.turn_id == "t1" and again.state == state  # the journal replays
    assert (again.turn.attempts, again.turn.retries) == (2, 1)
    await commit(proto, again)
    assert await stored(proto) == ["t2", "t1"]
    events = [e for _, e in await proto.read_events(CID, "t1")]
    types = [e.type for e in events]
    assert types[types.index("done") :][:3] == ["done", "retried", "status"]
    assert [e.data for e in events if e.type == "retried"] == [{"retry": 1}]
    assert [e.data for e in events if e.type == "resumed"] == [{"reason": "retried", "attempt": 2}]
    assert [e.data["status"] for e in events if e.type == "done"] == ["failed", "succeeded"]


async def test_a_resent_retry_changes_nothing_twice(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await submit_all(proto, CID, "t1")
    await fail_with_a_step(proto)
    assert not (await proto.retry(CID, "t1", token="same")).repeated
    before = snapshot(store_client, proto.keys.prefix)
    repeated = await proto.retry(CID, "t1", token="same")
    assert (repeated.repeated, repeated.status, repeated.retries) == (True, "queued", 1)
    assert snapshot(store_client, proto.keys.prefix) == before
    # Another request for the same turn, now queued again, is refused: not failed.
    with pytest.raises(TurnNotRetryableError) as refused:
        await proto.retry(CID, "t1", token="other")
    assert refused.value.details["status"] == "queued"
    assert snapshot(store_client, proto.keys.prefix) == before


@pytest.mark.parametrize("status", ["queued", "running", "succeeded", "cancelled"])
async def test_a_turn_that_did_not_fail_is_refused_and_nothing_changes(
    proto: TurnProtocol, store_client: redis.Redis, status: str
) -> None:
    await submit_all(proto, CID, "t1")
    if status in ("running", "succeeded"):
        acquired = await take(proto)
        if status == "succeeded":
            await commit(proto, acquired)
    if status == "cancelled":
        await proto.cancel(CID, "t1")
    before = snapshot(store_client, proto.keys.prefix)
    with pytest.raises(TurnNotRetryableError) as refused:
        await proto.retry(CID, "t1", token="r1")
    assert refused.value.details == {"status": status, "conversation_id": CID, "turn_id": "t1"}
    assert f"is {status}, not failed" in refused.value.message
    assert snapshot(store_client, proto.keys.prefix) == before


async def test_an_unknown_turn_is_refused(proto: TurnProtocol) -> None:
    with pytest.raises(UnknownTurnError):
        await proto.retry(CID, "nope", token="r1")


async def test_a_retried_turn_gets_its_budgets_afresh(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await submit_all(proto, CID, "t1")
    for _ in range(2):  # its worker died twice: over max_attempts=2 on the next take
        stale = await take(proto, max_attempts=2)
        store_client.delete(proto.keys.lease(CID))
    assert await proto.acquire(CID, worker_id="w1", lease_ms=LEASE, max_attempts=2) is None
    assert (await proto.get_turn(CID, "t1")).status == "failed"
    await proto.retry(CID, "t1", token="r1")
    # A report of a run from before the retry is not counted against the new budgets.
    assert not await proto.report_cut_off(CID, "t1", fence=stale.fence)
    for _ in range(2):
        assert (await take(proto, max_attempts=2)).turn.turn_id == "t1"
        store_client.delete(proto.keys.lease(CID))
    assert await proto.acquire(CID, worker_id="w1", lease_ms=LEASE, max_attempts=2) is None
    record = await proto.get_turn(CID, "t1")
    assert record.status == "failed" and record.attempts == 4 and record.retries == 1
    assert record.error is not None and record.error["details"]["crashed_runs"] == 2


async def test_a_full_inbox_refuses_the_retry_and_nothing_changes(
    protocol_url: str, key_prefix: str, store_client: redis.Redis
) -> None:
    limits = QueueLimits(per_conversation=2)
    async with open_protocol(protocol_url, key_prefix, queue_limits=limits) as proto:
        await submit_all(proto, CID, "t1", "t2")
        await fail_with_a_step(proto)
        await submit_all(proto, CID, "t3")  # t2 and t3 fill the inbox
        before = snapshot(store_client, proto.keys.prefix)
        with pytest.raises(QueueFullError):
            await proto.retry(CID, "t1", token="r1")
        assert snapshot(store_client, proto.keys.prefix) == before
        assert (await proto.get_turn(CID, "t1")).status == "failed"


@pytest.mark.parametrize("key", ["inbox", "journal", "events"])
async def test_a_key_of_another_type_is_named_and_nothing_changes(
    proto: TurnProtocol, store_client: redis.Redis, key: str
) -> None:
    await submit_all(proto, CID, "t1")
    await fail_with_a_step(proto)
    name = {
        "inbox": proto.keys.inbox(CID),
        "journal": proto.keys.journal(CID, "t1"),
        "events": proto.keys.events(CID, "t1"),
    }[key]
    break_key(store_client, name)
    before = snapshot(store_client, proto.keys.prefix)
    with pytest.raises(CorruptDataError) as caught:
        await proto.retry(CID, "t1", token="r1")
    assert caught.value.details["key"] == name
    assert snapshot(store_client, proto.keys.prefix) == before

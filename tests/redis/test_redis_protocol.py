"""The turn protocol's guards against a real redis-server, one behaviour per test."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from convoq.errors import (
    ConversationBusyError,
    NotInboxHeadError,
    ProtocolError,
    StaleFenceError,
    TurnAlreadyAppliedError,
    TurnCancelledError,
    UnknownTurnError,
)
from convoq.messages import ImagePart, Message, TextPart, ToolCall
from convoq.redis import Acquired, TurnProtocol
from convoq.redis.protocol import TurnEnding
from convoq.turn_state import TurnEvent, TurnState, expire_undecided
from tests.support.protocol_helpers import exchange, submit_all

# Run again with the fast paths off by `make test-slowpaths`.
pytestmark = pytest.mark.slowpaths

CID = "conv-1"
LEASE = 30_000


@pytest.fixture
def protocol_url(store_url: str) -> str:
    return store_url


async def submit(proto: TurnProtocol, *turn_ids: str) -> None:
    await submit_all(proto, CID, *turn_ids)


async def acquire(proto: TurnProtocol, worker: str = "w1", **kw: int) -> Acquired:
    acquired = await proto.acquire(CID, worker_id=worker, lease_ms=kw.pop("lease_ms", LEASE), **kw)
    assert acquired is not None
    return acquired


def whole_turn(acquired: Acquired, reply: str = "ok") -> list[Message]:
    return [acquired.turn.input, Message.assistant(reply)]


async def commit(
    proto: TurnProtocol, acquired: Acquired, reply: str = "ok", **kw: Any
) -> Acquired | None:

    return await proto.commit(
        CID,
        acquired.turn.turn_id,
        whole_turn(acquired, reply),
        TurnEnding(fence=acquired.fence, lease_ms=LEASE, **kw),
    )


def parked_state(acquired: Acquired, *call_ids: str) -> TurnState:
    calls = [ToolCall(id=c, name="delete_everything") for c in call_ids]
    return TurnState(
        messages=[acquired.turn.input, Message.assistant("", tool_calls=calls)],
        steps=1,
        pending=calls,
    )


async def stored_texts(proto: TurnProtocol) -> list[str]:
    return [m.text for m in await proto.history(CID) if m.role == "user"]


async def test_stale_fence_cannot_commit(proto: TurnProtocol, store_client: redis.Redis) -> None:
    await submit(proto, "t1")
    first = await acquire(proto, "w1")
    store_client.delete(proto.keys.lease(CID))  # the lease lapsed
    second = await acquire(proto, "w2")
    assert second.fence > first.fence
    with pytest.raises(StaleFenceError):
        await commit(proto, first)
    assert await stored_texts(proto) == []
    assert await commit(proto, second) is None
    assert await stored_texts(proto) == ["t1"]


async def test_commit_twice_appends_once(proto: TurnProtocol, store_client: redis.Redis) -> None:
    await submit(proto, "t1")
    acquired = await acquire(proto)
    await commit(proto, acquired)
    with pytest.raises(TurnAlreadyAppliedError):
        await commit(proto, acquired)
    assert await stored_texts(proto) == ["t1"]
    assert store_client.hget(proto.keys.meta(CID), "turns") == b"1"


async def test_commit_of_a_turn_that_is_not_the_inbox_head_is_refused(
    proto: TurnProtocol,
) -> None:
    await submit(proto, "t1", "t2")
    acquired = await acquire(proto)
    with pytest.raises(NotInboxHeadError):
        await proto.commit(
            CID, "t2", exchange("t2"), TurnEnding(fence=acquired.fence, lease_ms=LEASE)
        )
    assert await stored_texts(proto) == []
    assert (await proto.get_turn(CID, "t2")).status == "queued"


async def test_fail_stores_nothing_and_hands_over_the_next_turn(proto: TurnProtocol) -> None:
    await submit(proto, "t1", "t2")
    acquired = await acquire(proto)
    error = ProtocolError("model exploded").to_data()
    following = await proto.fail(CID, "t1", error, TurnEnding(fence=acquired.fence, lease_ms=LEASE))
    record = await proto.get_turn(CID, "t1")
    assert record.status == "failed"
    assert record.error == error
    assert record.result is None
    assert await stored_texts(proto) == []
    assert following is not None
    assert following.turn.turn_id == "t2"
    assert following.fence == acquired.fence  # hand-off keeps the lease


async def test_commit_replayed_after_a_dropped_reply_appends_once(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await submit(proto, "t1")
    acquired = await acquire(proto)
    keys, args = proto.commit_call(
        CID, "t1", whole_turn(acquired), TurnEnding(fence=acquired.fence, lease_ms=LEASE)
    )
    await proto.scripts.run("commit", keys, args)  # the reply is lost on the way back
    with pytest.raises(TurnAlreadyAppliedError):
        await proto.commit(
            CID, "t1", whole_turn(acquired), TurnEnding(fence=acquired.fence, lease_ms=LEASE)
        )
    assert store_client.llen(proto.keys.turns(CID)) == 1
    assert await stored_texts(proto) == ["t1"]


async def test_repeated_idempotency_key_returns_the_first_turn(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    message = Message.user("pay the invoice")
    first = await proto.submit(
        CID, "t1", agent="bot", message=message, options={}, idempotency_key="invoice-7"
    )
    again = await proto.submit(
        CID, "t2", agent="bot", message=message, options={}, idempotency_key="invoice-7"
    )
    assert (first.turn_id, first.position, first.duplicate) == ("t1", 0, False)
    assert (again.turn_id, again.duplicate) == ("t1", True)
    assert store_client.lrange(proto.keys.inbox(CID), 0, -1) == [b"t1"]
    with pytest.raises(UnknownTurnError):
        await proto.get_turn(CID, "t2")


async def test_resent_submit_with_the_same_turn_id_queues_nothing(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await submit(proto, "t1")
    again = await proto.submit(CID, "t1", agent="bot", message=Message.user("t1"), options={})
    assert again.duplicate
    assert store_client.llen(proto.keys.inbox(CID)) == 1


async def test_submit_reports_position_and_rejects_when_busy(proto: TurnProtocol) -> None:
    first = await proto.submit(CID, "t1", agent="bot", message=Message.user("a"), options={})
    second = await proto.submit(CID, "t2", agent="bot", message=Message.user("b"), options={})
    assert (first.position, second.position) == (0, 1)
    with pytest.raises(ConversationBusyError):
        await proto.submit(
            CID, "t3", agent="bot", message=Message.user("c"), options={}, if_busy="reject"
        )
    with pytest.raises(UnknownTurnError):
        await proto.get_turn(CID, "t3")


async def test_park_reserves_the_conversation_until_every_call_is_decided(
    proto: TurnProtocol,
) -> None:
    await submit(proto, "t1", "t2")
    acquired = await acquire(proto)
    state = parked_state(acquired, "call-a", "call-b")
    await proto.park(CID, "t1", fence=acquired.fence, state=state, approval_ttl_ms=60_000)
    await proto.park(CID, "t1", fence=acquired.fence, state=state, approval_ttl_ms=60_000)
    record = await proto.get_turn(CID, "t1")
    assert record.status == "awaiting_approval"
    assert [c["id"] for c in record.result["pending_approvals"]] == ["call-a", "call-b"]
    assert await proto.acquire(CID, worker_id="w2", lease_ms=LEASE) is None
    assert await proto.decide(CID, "t1", call_id="call-a", approved=True) == "pending"
    assert await proto.decide(CID, "t1", call_id="call-a", approved=True) == "pending"
    assert await proto.acquire(CID, worker_id="w2", lease_ms=LEASE) is None
    decided = await proto.decide(CID, "t1", call_id="call-b", approved=False, reason="no")
    assert decided == "resume"
    resumed = await acquire(proto, "w2")
    assert resumed.turn.turn_id == "t1"
    assert resumed.turn.status == "running"
    assert resumed.fence > acquired.fence
    assert resumed.state is not None
    assert resumed.state.messages == state.messages
    assert resumed.state.decisions["call-a"].approved is True
    assert resumed.state.decisions["call-b"].approved is False
    assert resumed.state.decisions["call-b"].reason == "no"


async def test_decide_refuses_unknown_calls_changed_minds_and_unparked_turns(
    proto: TurnProtocol,
) -> None:
    await submit(proto, "t1")
    acquired = await acquire(proto)
    with pytest.raises(ProtocolError, match="not awaiting approval"):
        await proto.decide(CID, "t1", call_id="c", approved=True)
    await proto.park(
        CID, "t1", fence=acquired.fence, state=parked_state(acquired, "c"), approval_ttl_ms=60_000
    )
    with pytest.raises(ProtocolError, match="no pending tool call"):
        await proto.decide(CID, "t1", call_id="other", approved=True)
    with pytest.raises(UnknownTurnError):
        await proto.decide(CID, "nope", call_id="c", approved=True)
    assert await proto.decide(CID, "t1", call_id="c", approved=True) == "resume"
    with pytest.raises(ProtocolError, match="already decided"):
        await proto.decide(CID, "t1", call_id="c", approved=False)


async def test_discard_frees_a_parked_conversation(proto: TurnProtocol) -> None:
    await submit(proto, "t1", "t2")
    acquired = await acquire(proto)
    await proto.park(
        CID, "t1", fence=acquired.fence, state=parked_state(acquired, "c"), approval_ttl_ms=60_000
    )
    assert await proto.discard(CID, "t1", reason="changed my mind") is True
    assert await proto.discard(CID, "t1") is True  # a repeat is a no-op
    record = await proto.get_turn(CID, "t1")
    assert record.status == "cancelled"
    assert record.error is not None
    assert record.error["type"] == "TurnCancelledError"
    nxt = await acquire(proto, "w2")
    assert nxt.turn.turn_id == "t2"
    assert await stored_texts(proto) == []


async def test_expired_lease_is_taken_over_and_the_old_holder_is_refused(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await submit(proto, "t1")
    old = await acquire(proto, "w1")
    assert await proto.acquire(CID, worker_id="w2", lease_ms=LEASE) is None
    # The lease is a key with a PX lifetime: its expiry is the key going, done here by the
    # test rather than raced against a short lifetime.
    assert store_client.delete(proto.keys.lease(CID)) == 1
    new = await acquire(proto, "w2")
    assert new.turn.turn_id == "t1"
    assert new.turn.attempts == 2
    assert new.fence > old.fence
    with pytest.raises(StaleFenceError):
        await proto.renew(CID, fence=old.fence, lease_ms=LEASE)
    with pytest.raises(StaleFenceError):
        await commit(proto, old)
    await proto.renew(CID, fence=new.fence, lease_ms=LEASE)
    await commit(proto, new)
    assert await stored_texts(proto) == ["t1"]


async def test_attempts_counter_fails_a_turn_after_max_attempts(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await submit(proto, "t1", "t2")
    for _ in range(2):
        acquired = await acquire(proto, max_attempts=2)
        assert acquired.turn.turn_id == "t1"
        store_client.delete(proto.keys.lease(CID))  # its worker died
    nxt = await acquire(proto, max_attempts=2)
    assert nxt.turn.turn_id == "t2"
    record = await proto.get_turn(CID, "t1")
    assert record.status == "failed"
    assert record.error is not None
    assert record.error["type"] == "MaxAttemptsExceededError"
    assert record.attempts == 2


async def test_checkpoint_is_what_a_rerun_starts_from(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await submit(proto, "t1")
    first = await acquire(proto)
    assert first.state is None
    state = TurnState(messages=[first.turn.input, Message.assistant("half")], steps=1)
    await proto.checkpoint(CID, "t1", fence=first.fence, state=state)
    store_client.delete(proto.keys.lease(CID))
    second = await acquire(proto, "w2")
    assert second.state == state
    with pytest.raises(StaleFenceError):
        await proto.checkpoint(CID, "t1", fence=first.fence, state=state)


async def test_cancel_a_queued_turn(proto: TurnProtocol, store_client: redis.Redis) -> None:
    await submit(proto, "t1", "t2")
    assert await proto.cancel(CID, "t2") == "cancelled"
    assert store_client.lrange(proto.keys.inbox(CID), 0, -1) == [b"t1"]
    assert (await proto.get_turn(CID, "t2")).status == "cancelled"
    events = [e for _, e in await proto.read_events(CID, "t2")]
    assert events[-1] == TurnEvent(type="done", data={"status": "cancelled"})
    assert await proto.cancel(CID, "t2") == "finished"


async def test_cancel_a_running_turn_asks_its_runner_to_stop(proto: TurnProtocol) -> None:
    await submit(proto, "t1")
    acquired = await acquire(proto)
    assert not await proto.is_cancel_requested(CID, "t1")
    assert await proto.cancel(CID, "t1") == "stopping"
    assert await proto.is_cancel_requested(CID, "t1")
    error = TurnCancelledError("the turn was cancelled").to_data()
    await proto.fail(CID, "t1", error, TurnEnding(fence=acquired.fence, lease_ms=LEASE))
    assert (await proto.get_turn(CID, "t1")).status == "cancelled"
    assert await stored_texts(proto) == []


async def test_clear_is_refused_while_a_turn_runs_unless_forced(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await submit(proto, "t0")
    await commit(proto, await acquire(proto))
    await submit(proto, "t1")
    await acquire(proto)
    with pytest.raises(ConversationBusyError):
        await proto.clear(CID)
    assert await stored_texts(proto) == ["t0"]
    await proto.clear(CID, force=True)
    assert list(store_client.scan_iter(match=f"{proto.keys.prefix}*")) == []


async def test_clear_removes_every_key_of_an_idle_conversation(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    other = "someone-else"
    await proto.submit(other, "x1", agent="bot", message=Message.user("keep"), options={})
    await submit(proto, "t1")
    await commit(proto, await acquire(proto))
    await proto.clear(CID)
    left = {k.decode() for k in store_client.scan_iter(match=f"{proto.keys.prefix}*")}
    assert left and all(k.startswith(f"{proto.keys.prefix}:{{{other}}}") for k in left)


async def test_attachments_are_stored_once_and_restored_bit_for_bit(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    picture = bytes(range(256)) * 40
    for tid in ("t1", "t2"):
        message = Message(content=[TextPart(text=tid), ImagePart(data=picture, mime_type="x/y")])
        await proto.submit(CID, tid, agent="bot", message=message, options={})
    nxt = await commit(proto, await acquire(proto))
    assert nxt is not None
    assert nxt.history[0].content[1] == ImagePart(data=picture, mime_type="x/y")
    await commit(proto, nxt)
    assert store_client.hlen(proto.keys.blobs(CID)) == 1
    history = await proto.history(CID, last_turns=1)
    assert [m.text for m in history] == ["t2", "ok"]
    assert history[0].attachments[0].data == picture


async def test_acquire_returns_the_history_window(proto: TurnProtocol) -> None:
    for n in range(5):
        await submit(proto, f"t{n}")
    acquired = await acquire(proto, window=2)
    while acquired.turn.turn_id != "t4":
        following = await proto.commit(
            CID,
            acquired.turn.turn_id,
            whole_turn(acquired),
            TurnEnding(fence=acquired.fence, lease_ms=LEASE, window=2),
        )
        assert following is not None
        acquired = following
    assert [m.text for m in acquired.history] == ["t2", "ok", "t3", "ok"]


async def test_events_are_emitted_and_read_in_order(proto: TurnProtocol) -> None:
    await submit(proto, "t1")
    acquired = await acquire(proto)
    await proto.emit(CID, "t1", TurnEvent(type="text_delta", data={"text": "he"}))
    await commit(proto, acquired, "hello")
    events = await proto.read_events(CID, "t1")
    kinds = [e.type for _, e in events]
    assert kinds == ["status", "status", "text_delta", "status", "done"]
    assert events[-1][1].data == {"status": "succeeded"}
    later = await proto.read_events(CID, "t1", after=events[1][0])
    assert [e.type for _, e in later] == kinds[2:]
    assert await proto.read_events(CID, "t1", after=events[-1][0], block_ms=20) == []


async def test_sweep_finds_orphaned_inboxes_and_expired_approvals(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await submit(proto, "t1", "t2")
    assert await proto.sweep_candidates() == [CID]
    acquired = await acquire(proto)
    assert await proto.sweep_candidates() == []
    await proto.park(
        CID, "t1", fence=acquired.fence, state=parked_state(acquired, "a", "c"),
        approval_ttl_ms=LEASE,
    )  # fmt: skip
    assert await proto.decide(CID, "t1", call_id="a", approved=True, by="ann") == "pending"
    assert await proto.sweep_candidates() == []  # parked, the approval still open
    # The parked lease lives as long as the approval may wait: its end is the expiry,
    # ended here by the test (no race with a clock). Then the conversation is kicked, and
    # c can no longer be decided.
    assert store_client.delete(proto.keys.lease(CID)) == 1
    assert await proto.sweep_candidates() == [CID]
    with pytest.raises(ProtocolError, match="expired"):
        await proto.decide(CID, "t1", call_id="c", approved=True)
    # The next acquire runs the turn on, stamped as expired (a's approval stands); the
    # runner decides c as expired from that stamp.
    again = await acquire(proto)
    assert again.turn.turn_id == "t1" and again.state is not None
    assert again.turn.expired_ms is not None and again.turn.status == "running"
    decisions = again.state.decisions
    assert decisions["a"].approved and decisions["a"].by == "ann" and not decisions["a"].expired
    assert [c.id for c in again.state.undecided] == ["c"]
    [event] = expire_undecided(again.state, again.turn.expired_ms)
    assert event.data["call_id"] == "c" and event.data["expired"] is True
    assert again.state.decisions["c"].at_ms == again.turn.expired_ms
    decided = [e.data for _, e in await proto.read_events(CID, "t1") if e.type == "decision"]
    assert [(d["call_id"], d["approved"], d["by"]) for d in decided] == [("a", True, "ann")]
    assert decided[0]["at_ms"] <= again.turn.expired_ms


async def test_epoch_marker_detects_a_replaced_dataset(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    epoch = await proto.check_epoch(None)
    assert await proto.check_epoch(epoch) == epoch
    store_client.delete(proto.keys.epoch())  # Redis came back empty
    with pytest.raises(Exception, match="dataset changed"):
        await proto.check_epoch(epoch)


@pytest.mark.parametrize("peeked", [False, True], ids=["acquired", "in-script"])
async def test_hand_off_skips_a_vanished_turn_and_frees_the_lease(
    proto: TurnProtocol, store_client: redis.Redis, peeked: bool
) -> None:
    await submit(proto, "t1", "t2")
    acquired = await acquire(proto)
    assert acquired.next_turn_id == "t2"
    store_client.delete(proto.keys.turn(CID, "t2"))  # its record is gone
    expected = acquired.next_turn_id if peeked else None
    assert await commit(proto, acquired, next_turn_id=expected) is None
    assert store_client.exists(proto.keys.lease(CID)) == 0
    assert store_client.llen(proto.keys.inbox(CID)) == 0
    await submit(proto, "t3")
    assert (await acquire(proto, "w2")).turn.turn_id == "t3"


async def test_commit_hands_out_the_expected_next_turn_in_the_same_script_call(
    proto: TurnProtocol,
) -> None:
    await submit(proto, "t1", "t2", "t3")
    first = await acquire(proto)
    assert first.next_turn_id == "t2"  # the peek behind the head
    keys, args = proto.commit_call(
        CID,
        "t1",
        whole_turn(first),
        TurnEnding(fence=first.fence, lease_ms=LEASE, next_turn_id="t2"),
    )
    reply = await proto.scripts.run("commit", keys, args)
    assert reply[:3] == ["OK", b"t2", None]
    assert reply[3][:2] == [b"OK", str(first.fence).encode()]  # t2, handed out by commit
    # The next peek, the window (turns) it came with, and no stored summary.
    assert reply[3][8:] == [b"t3", 0, b"0"]
    second = await proto.acquire(CID, worker_id="w2", lease_ms=LEASE)
    assert second is None  # the lease is held: kept for t2
    record = await proto.get_turn(CID, "t2")
    assert (record.status, record.attempts) == ("running", 1)
    events = [e.type for _, e in await proto.read_events(CID, "t2")]
    assert events == ["status", "status"]  # queued, running


async def test_commit_and_fail_hand_over_turns_as_acquire_would(proto: TurnProtocol) -> None:
    await submit(proto, "t1", "t2", "t3")
    first = await acquire(proto)
    second = await commit(proto, first, "one", next_turn_id=first.next_turn_id)
    assert second is not None
    assert (second.turn.turn_id, second.turn.status, second.turn.attempts) == ("t2", "running", 1)
    assert second.fence == first.fence  # the same lease
    assert [m.text for m in second.history] == ["t1", "one"]
    assert second.next_turn_id == "t3"
    error = ProtocolError("boom").to_data()
    third = await proto.fail(
        CID, "t2", error, TurnEnding(fence=second.fence, lease_ms=LEASE, next_turn_id="t3")
    )
    assert third is not None
    assert (third.turn.turn_id, third.fence, third.next_turn_id) == ("t3", first.fence, None)
    assert [m.text for m in third.history] == ["t1", "one"]  # t2 failed: nothing stored
    assert (await proto.get_turn(CID, "t2")).status == "failed"
    assert await commit(proto, third, next_turn_id=third.next_turn_id) is None
    assert await stored_texts(proto) == ["t1", "t3"]
    assert await proto.redis.exists(proto.keys.lease(CID)) == 0


async def test_a_wrong_expectation_falls_back_to_acquiring_the_head(proto: TurnProtocol) -> None:
    await submit(proto, "t1", "t2", "t3")
    first = await acquire(proto)
    second = await commit(proto, first, next_turn_id="t3")  # t2 heads the inbox, not t3
    assert second is not None
    assert (second.turn.turn_id, second.fence, second.next_turn_id) == ("t2", first.fence, "t3")
    assert second.turn.attempts == 1


async def test_hand_off_fails_an_expected_turn_over_max_attempts_and_goes_on(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await submit(proto, "t1", "t2", "t3")
    first = await acquire(proto, max_attempts=2)
    store_client.hset(proto.keys.turn(CID, "t2"), "runs", "2")  # it killed two workers
    handoff = await proto.commit_and_hand_off(
        CID,
        "t1",
        whole_turn(first),
        TurnEnding(fence=first.fence, lease_ms=LEASE, max_attempts=2, next_turn_id="t2"),
    )
    following = handoff.turn
    assert following is not None
    assert (following.turn.turn_id, following.fence) == ("t3", first.fence)
    assert handoff.failed == ("t2",)
    record = await proto.get_turn(CID, "t2")
    assert record.status == "failed"
    assert record.error is not None
    assert record.error["type"] == "MaxAttemptsExceededError"

"""The scripts of waits for the world (park's waits, decide with a result, signal) against
a real redis-server and the Redis Cluster: a result resumes the turn once, a repeat is
kept and another result refused; bad input is refused with nothing written; signals
sent before a wait are kept for it, one signal satisfies one wait; a lost reply resent
changes nothing; a wait past its deadline refuses its result and is handed out expired."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from convoq.errors import ConvoqError, ProtocolError, SignalBacklogFullError
from convoq.messages import Message, ToolCall
from convoq.redis import TurnProtocol
from convoq.turn_state import TurnState, Wait
from tests.support.protocol_helpers import open_protocol, submit_all
from tests.support.redis_proxy import LossyProxy
from tests.support.redis_server import RedisServer

LEASE = 30_000
DAY = 86_400_000


@pytest.fixture
def protocol_url(store_url: str) -> str:
    return store_url


def _state(taken_input: Message, waits: dict[str, Wait | None]) -> TurnState:
    calls = [ToolCall(id=c, name="job", arguments={}) for c in waits]
    return TurnState(
        messages=[taken_input, Message.assistant("", tool_calls=calls)], steps=1,
        pending=calls, waits={c: w for c, w in waits.items() if w is not None},
    )  # fmt: skip


async def _park(proto: TurnProtocol, cid: str, ttl_ms: int = 60_000, **waits: Wait | None) -> str:
    await submit_all(proto, cid, "t1")
    taken = await proto.acquire(cid, worker_id="w1", lease_ms=LEASE)
    assert taken is not None
    state = _state(taken.turn.input, waits)
    return await proto.park(cid, "t1", fence=taken.fence, state=state, approval_ttl_ms=ttl_ms)


RESULT = Wait(on="result", metadata={"job": 7})
PAID = Wait(on="signal", name="paid")


async def _signal(proto: TurnProtocol, cid: str, payload: str, sid: str | None = None) -> object:
    return await proto.send_signal(cid, "paid", payload, signal_id=sid, max_kept=2, ttl_ms=DAY)


async def _snapshot(proto: TurnProtocol, cid: str) -> dict[bytes, object]:
    """Every key of the conversation and what it holds (events by length)."""
    found: dict[bytes, object] = {}
    async for key in proto.redis.scan_iter(match=proto.keys.conversation_pattern(cid)):
        kind = (await proto.redis.type(key)).decode()
        if kind == "hash":
            found[key] = await proto.redis.hgetall(key)
        elif kind == "list":
            found[key] = await proto.redis.lrange(key, 0, -1)
        elif kind == "stream":
            found[key] = await proto.redis.xlen(key)
        else:
            found[key] = kind
    return found


async def test_a_result_resumes_once_a_repeat_is_kept_another_is_refused(
    proto: TurnProtocol,
) -> None:
    assert await _park(proto, "c", job=RESULT) == "parked"
    record = await proto.get_turn("c", "t1")
    assert record.status == "waiting"
    assert record.result is not None and record.result["waits"]["job"]["metadata"] == {"job": 7}
    first = await proto.record_decision("c", "t1", call_id="job", approved=True, kind="result",
                                        result='{"ok":1}')  # fmt: skip
    assert (first.outcome, first.repeated) == ("resume", False)
    again = await proto.record_decision("c", "t1", call_id="job", approved=True, kind="result",
                                        result='{"ok":1}')  # fmt: skip
    assert (again.outcome, again.repeated) == ("resume", True)
    before = await _snapshot(proto, "c")
    with pytest.raises(ProtocolError, match="already decided otherwise"):
        await proto.record_decision("c", "t1", call_id="job", approved=True, kind="result",
                                    result='{"ok":2}')  # fmt: skip
    assert await _snapshot(proto, "c") == before
    taken = await proto.acquire("c", worker_id="w2", lease_ms=LEASE)
    assert taken is not None and taken.state is not None
    decision = taken.state.decisions["job"]
    assert decision.result == '{"ok":1}' and taken.state.waits == {"job": RESULT}


async def test_a_call_is_decided_only_by_what_it_waits_for(proto: TurnProtocol) -> None:
    await _park(proto, "c", job=RESULT, pay=PAID, vet=None)
    assert (await proto.get_turn("c", "t1")).status == "awaiting_approval"  # vet: a person
    before = await _snapshot(proto, "c")
    with pytest.raises(ProtocolError, match="waits for its result"):
        await proto.decide("c", "t1", call_id="job", approved=True)
    with pytest.raises(ProtocolError, match="waits for a signal"):
        await proto.record_decision("c", "t1", call_id="pay", approved=True, kind="result",
                                    result="1")  # fmt: skip
    with pytest.raises(ProtocolError, match="a person's decision"):
        await proto.record_decision("c", "t1", call_id="vet", approved=True, kind="result",
                                    result="1")  # fmt: skip
    with pytest.raises(ProtocolError, match="no pending tool call"):
        await proto.record_decision("c", "t1", call_id="nope", approved=True, kind="result",
                                    result="1")  # fmt: skip
    with pytest.raises(ConvoqError, match="signal name"):
        await proto.send_signal("c", "", "1", max_kept=2, ttl_ms=DAY)
    assert await _snapshot(proto, "c") == before
    # The approvals inbox offers only the call a person decides.
    (parked,) = await proto.parked_turns(conversation_prefix="c")
    assert [c["id"] for c in parked.record.result["pending_approvals"]] == ["vet"]  # type: ignore[index]


async def test_signals_before_the_wait_are_kept_and_the_oldest_taken_at_park(
    proto: TurnProtocol,
) -> None:
    kept = [await _signal(proto, "c", p) for p in ('"first"', '"second"')]
    assert [(s.outcome, s.kept) for s in kept] == [("kept", 1), ("kept", 2)]  # type: ignore[attr-defined]
    before = await _snapshot(proto, "c")
    with pytest.raises(SignalBacklogFullError):
        await _signal(proto, "c", '"third"')
    assert await _snapshot(proto, "c") == before
    # The wait takes the oldest at park and the turn goes on at once (no parked lease).
    assert await _park(proto, "c", pay=PAID) == "resume"
    assert await proto.redis.exists(proto.keys.lease("c")) == 0
    taken = await proto.acquire("c", worker_id="w2", lease_ms=LEASE)
    assert taken is not None and taken.state is not None
    assert taken.state.decisions["pay"].result == '"first"'
    events = [e.type for _, e in await proto.read_events("c", "t1")]
    assert events.count("signal_delivered") == 1
    # The second is still kept, for the next wait.
    assert len(await proto.redis.lrange(proto.keys.signals("c", "paid"), 0, -1)) == 1


async def test_one_signal_satisfies_one_wait(proto: TurnProtocol) -> None:
    await _park(proto, "c", a=PAID, b=PAID)
    one = await _signal(proto, "c", "1")
    two = await _signal(proto, "c", "2")
    three = await _signal(proto, "c", "3")
    assert [(s.outcome, s.call_id, s.resume) for s in (one, two)] == [  # type: ignore[attr-defined]
        ("delivered", "a", False), ("delivered", "b", True),
    ]  # fmt: skip
    assert three.outcome == "kept"  # type: ignore[attr-defined]
    record = await proto.get_turn("c", "t1")
    assert {k: d.result for k, d in record.decisions.items()} == {"a": "1", "b": "2"}


async def test_the_same_signal_id_again_writes_nothing(proto: TurnProtocol) -> None:
    await _park(proto, "c", a=PAID, b=PAID)
    assert (await _signal(proto, "c", "1", sid="evt")).outcome == "delivered"  # type: ignore[attr-defined]
    before = await _snapshot(proto, "c")
    assert (await _signal(proto, "c", "1", sid="evt")).outcome == "duplicate"  # type: ignore[attr-defined]
    assert await _snapshot(proto, "c") == before


async def test_a_wait_past_its_deadline_refuses_its_result_and_runs_expired(
    proto: TurnProtocol,
) -> None:
    short = Wait(on="result", timeout_s=0.5)
    await _park(proto, "c", job=short, ttl_ms=DAY)  # the call's deadline, not the day
    expires = int(await proto.redis.hget(proto.keys.lease("c"), "expires_ms"))  # type: ignore[arg-type]
    parked = int((await proto.redis.hget(proto.keys.turn("c", "t1"), "parked_ms")) or 0)
    assert expires - parked == 500
    deadline = time.monotonic() + 10
    while await proto.redis.exists(proto.keys.lease("c")) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    with pytest.raises(ProtocolError, match="expired"):
        await proto.record_decision("c", "t1", call_id="job", approved=True, kind="result",
                                    result="late")  # fmt: skip
    taken = await proto.acquire("c", worker_id="w2", lease_ms=LEASE)
    assert taken is not None and taken.turn.expired_ms is not None


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[LossyProxy]:
    lossy = LossyProxy(redis_server.port)
    yield lossy
    lossy.close()


async def test_lost_replies_resent_change_nothing(proxy: LossyProxy, key_prefix: str) -> None:
    async with open_protocol(proxy.url, key_prefix) as proto:
        await _signal(proto, "c", '"early"')  # scripts loaded, connection open
        await submit_all(proto, "c", "t1")
        taken = await proto.acquire("c", worker_id="w1", lease_ms=LEASE)
        assert taken is not None
        state = _state(taken.turn.input, {"pay": PAID, "job": RESULT})
        proxy.drop_reply_to(b"EVALSHA")
        assert await proto.park("c", "t1", fence=taken.fence, state=state,
                                approval_ttl_ms=60_000) == "parked"  # fmt: skip
        assert proxy.dropped == 1
        kept = await proto.redis.lrange(proto.keys.signals("c", "paid"), 0, -1)
        assert kept == []  # taken once by the park, not twice
        proxy.drop_reply_to(b"EVALSHA")
        decided = await proto.record_decision("c", "t1", call_id="job", approved=True,
                                              kind="result", result="1")  # fmt: skip
        assert proxy.dropped == 2 and decided.outcome == "resume"
        events = [e.type for _, e in await proto.read_events("c", "t1")]
        assert events.count("result_supplied") == 1 and events.count("signal_delivered") == 1
        proxy.drop_reply_to(b"EVALSHA")
        await proto.send_signal("c", "paid", "2", signal_id="s2", max_kept=5, ttl_ms=DAY)
        assert proxy.dropped == 3
        assert len(await proto.redis.lrange(proto.keys.signals("c", "paid"), 0, -1)) == 1


async def test_a_park_that_resumed_at_once_resent_answers_resume(
    proxy: LossyProxy, key_prefix: str
) -> None:
    async with open_protocol(proxy.url, key_prefix) as proto:
        await _signal(proto, "c", '"early"')
        await submit_all(proto, "c", "t1")
        taken = await proto.acquire("c", worker_id="w1", lease_ms=LEASE)
        assert taken is not None
        state = _state(taken.turn.input, {"pay": PAID})
        proxy.drop_reply_to(b"EVALSHA")
        parked = await proto.park("c", "t1", fence=taken.fence, state=state, approval_ttl_ms=60_000)
        assert proxy.dropped == 1 and parked == "resume"  # the resend's answer: resumed
        events = [e.type for _, e in await proto.read_events("c", "t1")]
        assert events.count("signal_delivered") == 1 and events.count("status") == 3


async def test_a_kept_signal_lapses_after_its_ttl(proto: TurnProtocol) -> None:
    kept = await proto.send_signal("c", "paid", '"old"', max_kept=2, ttl_ms=300)
    assert kept.outcome == "kept"
    key = proto.keys.signals("c", "paid")
    deadline = time.monotonic() + 10
    while await proto.redis.exists(key) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert await _park(proto, "c", pay=PAID) == "parked"  # nothing left for the wait


async def test_a_waiting_turn_is_discarded_and_frees_its_conversation(proto: TurnProtocol) -> None:
    await _park(proto, "c", job=RESULT)
    await submit_all(proto, "c", "t2")
    assert await proto.discard("c", "t1") is True  # t2 waits behind it: kick it
    assert (await proto.get_turn("c", "t1")).status == "cancelled"
    with pytest.raises(ProtocolError):
        await proto.record_decision("c", "t1", call_id="job", approved=True, kind="result",
                                    result="1")  # fmt: skip
    taken = await proto.acquire("c", worker_id="w2", lease_ms=LEASE)
    assert taken is not None and taken.turn.turn_id == "t2"

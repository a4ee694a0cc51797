"""What the scripts behind the client's control kicks answer about the turn the kick is for,
on a real redis-server and the Redis Cluster: a decision, a result and a signal that resume
a turn name the agent its record names (the target, after a handoff); a retry names the
retried turn's; a cancel and a discard name the turn now first in line (its agent read
apart, one field); a duplicate signal names the inbox head."""

from __future__ import annotations

import pytest

from convoq.messages import Message
from convoq.redis import TurnEnding, TurnProtocol
from convoq.turn_state import TurnState, Wait
from tests.support.protocol_helpers import park_head

LEASE = 30_000
DAY = 86_400_000
PAID = Wait(on="signal", name="paid")
RESULT = Wait(on="result")


@pytest.fixture
def protocol_url(store_url: str) -> str:
    return store_url


async def _submit(proto: TurnProtocol, cid: str, tid: str, agent: str) -> None:
    await proto.submit(cid, tid, agent=agent, message=Message.user(tid), options={})


async def test_a_decision_that_resumes_names_the_agent_of_the_turn(proto: TurnProtocol) -> None:
    await _submit(proto, "c", "t1", "triage")
    await park_head(proto, "c", hand_to="billing", a=None, b=None)
    first = await proto.record_decision("c", "t1", call_id="a", approved=True)
    assert (first.outcome, first.agent) == ("pending", None)  # no kick owed yet
    last = await proto.record_decision("c", "t1", call_id="b", approved=False)
    assert (last.outcome, last.agent) == ("resume", "billing")  # the handoff's target
    again = await proto.record_decision("c", "t1", call_id="b", approved=False)
    assert (again.outcome, again.repeated, again.agent) == ("resume", True, "billing")


async def test_a_result_and_a_signal_that_resume_name_the_agent(proto: TurnProtocol) -> None:
    await _submit(proto, "c", "t1", "courier")
    await park_head(proto, "c", job=RESULT)
    decided = await proto.record_decision("c", "t1", call_id="job", approved=True,
                                          kind="result", result='"ok"')  # fmt: skip
    assert (decided.outcome, decided.agent) == ("resume", "courier")
    await _submit(proto, "d", "t1", "courier")
    await park_head(proto, "d", a=PAID, b=PAID)
    sent, kick = await proto.send_signal_routed("d", "paid", "1", signal_id="s1", max_kept=5,
                                                ttl_ms=DAY)  # fmt: skip
    assert (sent.outcome, sent.resume, kick) == ("delivered", False, None)
    sent, kick = await proto.send_signal_routed("d", "paid", "2", max_kept=5, ttl_ms=DAY)
    assert sent.resume and kick is not None and (kick.turn_id, kick.agent) == ("t1", "courier")
    # The first again (its kick lost with its answer): a drain for the inbox head.
    sent, kick = await proto.send_signal_routed("d", "paid", "1", signal_id="s1", max_kept=5,
                                                ttl_ms=DAY)  # fmt: skip
    assert sent.outcome == "duplicate"
    assert kick is not None and (kick.turn_id, kick.agent) == ("t1", "courier")
    for outcome in ("kept", "duplicate"):
        sent, kick = await proto.send_signal_routed("e", "paid", "1", signal_id="k1",
                                                    max_kept=5, ttl_ms=DAY)  # fmt: skip
        assert (sent.outcome, kick) == (outcome, None)  # no turn queued: nothing to wake


async def test_a_retry_names_the_agent_of_the_retried_turn(proto: TurnProtocol) -> None:
    await _submit(proto, "c", "t1", "courier")
    taken = await proto.acquire("c", worker_id="w1", lease_ms=LEASE)
    assert taken is not None
    state = TurnState(messages=[taken.turn.input])
    await proto.transfer("c", "t1", fence=taken.fence, state=state, agent="billing",
                         release=False)  # fmt: skip
    error = {"type": "ModelError", "message": "no", "details": {}}
    await proto.fail("c", "t1", error, TurnEnding(fence=taken.fence))
    retried = await proto.retry("c", "t1", token="tok")
    assert (retried.position, retried.agent) == (0, "billing")
    again = await proto.retry("c", "t1", token="tok")
    assert (again.repeated, again.agent) == (True, "billing")


async def test_a_cancel_and_a_discard_name_the_turn_now_first(proto: TurnProtocol) -> None:
    await _submit(proto, "c", "t1", "courier")
    await park_head(proto, "c", a=None)
    await _submit(proto, "c", "t2", "echo")
    await _submit(proto, "c", "t3", "courier")
    assert await proto.cancel_turn("c", "t3") == ("cancelled", "t1")  # not the head
    assert await proto.cancel_turn("c", "t1") == ("cancelled", "t2")
    assert await proto.turn_agent("c", "t2") == "echo"  # its kick's agent: read apart
    assert await proto.cancel_turn("c", "t1") == ("finished", None)
    await _submit(proto, "d", "t1", "courier")
    await park_head(proto, "d", a=None)
    await _submit(proto, "d", "t2", "echo")
    assert await proto.discard_turn("d", "t1") == "t2"
    assert await proto.discard_turn("d", "t1") == "t2"  # a repeat answers as the first
    await proto.cancel_turn("d", "t2")
    assert await proto.cancel_turn("d", "t2") == ("finished", None)
    await _submit(proto, "e", "t1", "courier")
    assert await proto.cancel_turn("e", "t1") == ("cancelled", None)  # none waits
    assert await proto.turn_agent("e", "nope") is None

"""Pydantic AI agents on real worker processes: memory across turns (mixed with convoq
agents' turns), an approval parked and resumed on another worker, workers killed -9
inside a tool call and between two model requests (counted in Redis: no finished model
request or tool call runs again), and streamed events."""

from __future__ import annotations

import uuid

import pytest
import redis

from convoq import Client
from convoq.messages import MessageRole
from tests.support.workers import WorkerPool, module_pool, wait_until

pytestmark = pytest.mark.slow

pool = module_pool(
    2,
    agents="tests.support.pydantic_ai_agents,tests.support.worker_agents",
    lease_ms=2000,
    sweep_interval_s=0.5,
    concurrency=2,
)


def _counts(r: redis.Redis, pool: WorkerPool, token: str, *what: str) -> dict[str, int]:
    return {w: int(r.get(f"{pool.prefix}:test:pai:{w}:{token}") or 0) for w in what}


def _pids(r: redis.Redis, pool: WorkerPool, what: str, token: str) -> list[int]:
    return [int(p) for p in r.lrange(f"{pool.prefix}:test:pai:pid:{what}:{token}", 0, -1)]


def test_a_pydantic_ai_agent_remembers_the_conversation_beside_a_convoq_agent(
    client: Client, r: redis.Redis, pool: WorkerPool
) -> None:
    cid = f"pai-{uuid.uuid4().hex[:8]}"
    token = f"t{uuid.uuid4().hex[:8]}"
    assert client.submit(cid, f"{token} one", agent="pai-chat").wait(30).text == f"{token} one"
    assert client.submit(cid, "convoq turn", agent="echo").wait(30).ok
    third = client.submit(cid, f"{token} three", agent="pai-chat").wait(30)
    assert third.text == f"{token} one | convoq turn | {token} three"
    history = client.history(cid)
    assert [m.role for m in history].count(MessageRole.USER) == 3
    assert history[-1].framework is not None and "pydantic_ai" in history[-1].framework
    assert _counts(r, pool, token, "model") == {"model": 2}


def _approve_all(client: Client, handle: object) -> None:
    parked = handle.wait(30)  # type: ignore[attr-defined]
    assert parked.status == "awaiting_approval"
    [call] = parked.pending_approvals
    assert call.name == "pay"
    assert client.approve(handle, call.id, by="alice") == "resume"  # type: ignore[arg-type]


def test_an_approval_parks_the_run_and_another_worker_resumes_it(
    client: Client, r: redis.Redis, pool: WorkerPool
) -> None:
    token = f"a{uuid.uuid4().hex[:8]}"
    handle = client.submit(f"pai-{token}", f"{token} pay", agent="pai-payer")
    parked = handle.wait(30)
    [call] = parked.pending_approvals
    [parker_pid] = _pids(r, pool, "model1", token)
    parker = next(w for w in pool.workers if w.pid == parker_pid)
    parker.stop()
    try:
        assert client.approve(handle, call.id, by="alice") == "resume"
        result = handle.wait(30)
    finally:
        pool.workers.remove(parker)
        pool.start(1)
    assert result.text == "found paid 5 via the-bank noted"
    assert _pids(r, pool, "pay", token)[0] != parker_pid
    assert _counts(r, pool, token, "model1", "lookup", "pay", "note", "model2", "model3") == {
        "model1": 1, "lookup": 1, "pay": 1, "note": 1, "model2": 1, "model3": 1,
    }  # fmt: skip
    tool = next(m for m in client.history(f"pai-{token}") if m.name == "pay")
    assert tool.decision is not None and tool.decision.by == "alice"


def _killed(pool: WorkerPool, pid: int) -> None:
    victim = next(w for w in pool.workers if w.pid == pid)
    victim.kill()
    pool.workers.remove(victim)
    pool.start(1)


def test_a_worker_killed_inside_a_tool_call_repeats_no_finished_step(
    client: Client, r: redis.Redis, pool: WorkerPool
) -> None:
    token = f"stall{uuid.uuid4().hex[:8]}"
    handle = client.submit(f"pai-{token}", f"{token} pay", agent="pai-payer")
    wait_until(lambda: _pids(r, pool, "lookup", token), 30, what="the tool to start")
    _killed(pool, _pids(r, pool, "lookup", token)[0])
    _approve_all(client, handle)
    assert handle.wait(60).text == "found paid 5 via the-bank noted"
    # The model request before the kill is journaled; the cut tool call ran again.
    assert _counts(r, pool, token, "model1", "lookup", "pay", "model2", "model3") == {
        "model1": 1, "lookup": 2, "pay": 1, "model2": 1, "model3": 1,
    }  # fmt: skip


def test_a_worker_killed_between_two_model_requests_repeats_no_finished_step(
    client: Client, r: redis.Redis, pool: WorkerPool
) -> None:
    token = f"m{uuid.uuid4().hex[:8]}"
    handle = client.submit(f"pai-{token}", f"{token} stall-model", agent="pai-payer")
    _approve_all(client, handle)
    wait_until(lambda: _pids(r, pool, "model2", token), 30, what="the second model request")
    _killed(pool, _pids(r, pool, "model2", token)[0])
    assert handle.wait(60).text == "found paid 5 via the-bank noted"
    # Request 1 and the tools it asked for stay done; only the cut request 2 ran again.
    assert _counts(r, pool, token, "model1", "lookup", "pay", "model2", "note", "model3") == {
        "model1": 1, "lookup": 1, "pay": 1, "model2": 2, "note": 1, "model3": 1,
    }  # fmt: skip


def test_a_run_streams_its_events_to_the_handle(client: Client) -> None:
    handle = client.submit(f"pai-{uuid.uuid4().hex[:8]}", "hello", agent="pai-stream")
    assert handle.wait(30).text == "streamed words here"
    events = list(handle.events(timeout=10))
    deltas = "".join(e.data["text"] for e in events if e.type == "text_delta")
    assert deltas == "streamed words here"
    assert [e.type for e in events][-1] == "done"
    assert "assistant" in [e.type for e in events]


def test_tool_calls_and_results_are_streamed_events(client: Client) -> None:
    token = f"e{uuid.uuid4().hex[:8]}"
    handle = client.submit(f"pai-{token}", f"{token} pay", agent="pai-payer")
    _approve_all(client, handle)
    assert handle.wait(30).ok
    events = list(handle.events(timeout=10))
    calls = [e.data["name"] for e in events if e.type == "tool_call"]
    assert sorted(calls) == ["lookup", "note", "pay"]
    assert [e.data["name"] for e in events if e.type == "approval_required"] == ["pay"]
    results = {e.data["name"]: e.data["result"] for e in events if e.type == "tool_result"}
    assert results["pay"] == "paid 5 via the-bank"


@pytest.mark.parametrize(
    ("agent", "seen"), [("pai-short", "{t} two | {t} three"), ("pai-budget", "{t} three")]
)
def test_the_history_window_of_the_profile_applies(client: Client, agent: str, seen: str) -> None:
    cid = f"pai-{uuid.uuid4().hex[:8]}"
    token = f"w{uuid.uuid4().hex[:8]}"
    for word in ("one", "two"):
        assert client.submit(cid, f"{token} {word}", agent=agent).wait(30).ok
    third = client.submit(cid, f"{token} three", agent=agent).wait(30)
    assert third.text == seen.format(t=token)
    assert len(client.history(cid)) == 6  # all turns stay stored


def test_a_deferred_pydantic_ai_call_resumes_with_the_result_posted(
    client: Client, pool: WorkerPool, redis_client: redis.Redis
) -> None:
    token = f"d{uuid.uuid4().hex[:8]}"
    handle = client.submit(f"pai-{token}", f"{token} ship it", agent="pai-shipper")
    wait_until(lambda: handle.status() == "waiting", 60, what="the run parks")
    record = handle.record()
    assert record.result is not None and record.result["waits"]["ship-1"]["metadata"] == {
        "token": token
    }
    assert client.complete_call(handle, "ship-1", "parcel T7 left") == "resume"
    result = handle.wait(60)
    assert result.status == "succeeded" and result.text == "carrier says: parcel T7 left"
    assert _counts(redis_client, pool, token, "ship") == {"ship": 1}  # not run again

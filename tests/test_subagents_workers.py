"""Sub-agents as child turns on real workers: a parent's three sub-agent calls fan out
as child turns on two worker pools (different queues), run at once, and the parent
resumes once with their three answers; one slot serves parent and children; a worker
killed mid-fan-out loses and duplicates no child; limits, failed children and cancelling
the parent; one step waiting for a person and a child at once."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from convoq.cli import app
from convoq.client import Client, TurnResult
from convoq.errors import UnknownTurnError
from convoq.memory import RedisConversationMemory
from convoq.queue.routing import partition_of
from convoq.subagents import child_ids
from tests.support.gateway import GatewayProcess, module_gateway, turns_path
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool, wait_until, webhook_receiver

AGENTS = "tests.support.subagent_agents"
ANSWER = "critic: critic task {q} | researcher: researcher task {q} | writer: writer task {q}"


def _pool(redis_server: RedisServer, logs: Path, **settings: Any) -> WorkerPool:
    return WorkerPool(redis_server.url, logs, agents=AGENTS, lease_ms=3000, **settings)


@pytest.fixture(scope="module")
def two_pools(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerPool]:
    """Two pools on one prefix: one consumes partitions 0-1, the other 2-3."""
    pool = _pool(redis_server, tmp_path_factory.mktemp("two"), concurrency=3)
    pool.env["SPREAD"] = "0,2,3"  # the boss's children: one on the first pool, two on the other
    pool.env["SUBAGENT_SLEEP_S"] = "2.5"  # long enough that they overlap on a loaded machine
    try:
        pool.start(1, partitions="0-1")
        pool.start(1, partitions="2-3")
        yield pool
    finally:
        pool.stop_all()


def _status(handle: Any) -> str | None:
    """A turn's status, None while it is not queued yet (its parent queues it after it
    parks)."""
    try:
        return str(handle.status())
    except UnknownTurnError:
        return None


def _cid(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _spans(r: redis.Redis, pool: WorkerPool) -> dict[str, tuple[int, float, float]]:
    raw = r.lrange(f"{pool.prefix}:test:sub:spans", 0, -1)
    return {said: (pid, start, end) for said, pid, start, end in map(json.loads, raw)}


def _check_family(
    pool: WorkerPool, client: Client, cid: str, result: TurnResult, q: str
) -> list[dict[str, Any]]:
    """The parent's answer is its three children's; each child is stored once on its own
    conversation and its record names the parent call; the parent's events name them."""
    assert result.status == "succeeded" and result.text == ANSWER.format(q=q), result
    events = list(client.handle(cid, result.turn_id).events(timeout=30))
    calls = [e.data for e in events if e.type == "subagent_call"]
    assert sorted(c["agent"] for c in calls) == ["critic", "researcher", "writer"]
    # It waited (no person asked), and resumed once, when the last child ended.
    statuses = [e.data["status"] for e in events if e.type == "status"]
    assert "waiting" in statuses and "awaiting_approval" not in statuses, statuses
    assert [e.data["reason"] for e in events if e.type == "resumed"] == ["children_done"]
    memory = RedisConversationMemory(pool.redis_url, prefix=pool.prefix)
    for call in calls:
        child_cid, child_tid = call["conversation_id"], call["turn_id"]
        asked = f"{call['agent']} task {q}"
        stored = [m.text for m in memory.load(child_cid)]
        assert stored == [asked, f"{call['agent']}: {asked}"], stored  # once, no duplicate
        record = client.handle(child_cid, child_tid).record()
        assert record.options["subagent"] == {
            "conversation_id": cid, "turn_id": result.turn_id, "call_id": call["id"], "depth": 1,
        }  # fmt: skip
        decision = result.decisions[call["id"]]
        assert decision.by == f"subagent {child_cid} {child_tid}"
    return calls


def test_three_calls_fan_out_on_two_pools_and_the_parent_resumes_once(
    two_pools: WorkerPool, redis_client: redis.Redis
) -> None:
    cid = _cid("boss")
    with two_pools.client() as client:
        result = client.submit(cid, "plan", agent="boss").wait(90)
        calls = _check_family(two_pools, client, cid, result, "plan")
    # The model of the parent: one call fanning out, one with the three answers.
    assert int(redis_client.get(f"{two_pools.prefix}:test:sub:boss:{cid}") or 0) == 2
    # The children were queued on both pools' partitions, and each ran on its own pool.
    first, second = (w.pid for w in two_pools.workers)
    spans = _spans(redis_client, two_pools)
    for call in calls:
        part = partition_of(call["conversation_id"], two_pools.partitions)
        pid = spans[f"{call['agent']} task plan"][0]
        assert pid == (first if part in (0, 1) else second), (part, pid)
    assert {partition_of(c["conversation_id"], 4) < 2 for c in calls} == {True, False}
    # They ran at once: each started before any of them ended.
    runs = [spans[f"{name} task plan"] for name in ("researcher", "writer", "critic")]
    assert max(start for _, start, _ in runs) < min(end for _, _, end in runs)


def test_one_slot_serves_the_parent_and_its_children(
    redis_server: RedisServer, tmp_path: Path, redis_client: redis.Redis
) -> None:
    pool = _pool(redis_server, tmp_path, concurrency=1)
    pool.env["SUBAGENT_SLEEP_S"] = "0.2"
    try:
        pool.start(1)
        cid = _cid("one-slot")
        with pool.client() as client:
            result = client.submit(cid, "solo", agent="boss").wait(90)
            _check_family(pool, client, cid, result, "solo")
    finally:
        pool.stop_all()


@pytest.mark.timeout(300)
def test_a_worker_killed_mid_fan_out_loses_and_duplicates_no_child(
    redis_server: RedisServer, tmp_path: Path, redis_client: redis.Redis
) -> None:
    pool = _pool(redis_server, tmp_path, concurrency=4)
    pool.env["SUBAGENT_SLEEP_S"] = "0.5"
    try:
        pool.start(2)
        cid = _cid("killed")
        with pool.client() as client:
            handle = client.submit(cid, "stall", agent="boss")
            stalled = f"{pool.prefix}:test:sub:stalled:researcher task stall"
            pid = int(wait_until(lambda: redis_client.get(stalled), 60, what="a child stalled"))
            victim = next(w for w in pool.workers if w.pid == pid)
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not victim.alive(), 10, what="the worker died")
            pool.start(1)  # the pool keeps two workers
            result = handle.wait(120)
            _check_family(pool, client, cid, result, "stall")
        runs = redis_client.get(f"{pool.prefix}:test:sub:runs:researcher task stall")
        assert int(runs or 0) == 2  # cut mid-call once, then run to its end on another worker
        assert int(redis_client.get(f"{pool.prefix}:test:sub:boss:{cid}") or 0) == 2
    finally:
        pool.stop_all()


@pytest.fixture(scope="module")
def pool(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerPool]:
    """One pool, sub-agent calls nesting at most 2 deep, at most 2 in one step."""
    pool = _pool(
        redis_server, tmp_path_factory.mktemp("one"), subagent_max_depth=2, subagent_max_fanout=2
    )
    pool.env["SUBAGENT_SLEEP_S"] = "0.1"
    try:
        pool.start(1)
        yield pool
    finally:
        pool.stop_all()


def test_calls_past_the_depth_limit_are_refused_with_a_tool_error(pool: WorkerPool) -> None:
    with pool.client() as client:
        result = client.submit(_cid("deep"), "go", agent="recurse").wait(90)
    # depth 1 and 2 ran as child turns; the third call was refused, the model read why.
    assert result.text.startswith("up(up(up(Error: sub-agent calls may nest 2 deep")
    assert "CONVOQ_SUBAGENT_MAX_DEPTH" in result.text and result.text.endswith(")))")


def test_a_pydantic_ai_profile_serves_as_a_sub_agent_by_name(pool: WorkerPool) -> None:
    with pool.client() as client:
        result = client.submit(_cid("pai"), "ask pai", agent="asks_pai").wait(90)
    assert result.text == "heard: pai says hi"


def test_a_failed_child_is_a_tool_error_the_parent_model_reads(pool: WorkerPool) -> None:
    with pool.client() as client:
        handle = client.submit(_cid("broken"), "use broken", agent="delegator")
        result = handle.wait(90)
    assert result.status == "succeeded"
    assert result.text.startswith("Error: the sub-agent 'broken' failed:")
    assert "the broken model fails" in result.text
    tool = [m for m in result.turn if m.role == "tool"]
    assert [m.text for m in tool] == [result.text]
    # A failed child stored no usage: it adds none to its parent's.
    assert [(c.agent, c.status, c.usage.requests) for c in result.children] == [
        ("broken", "failed", 0)
    ]
    assert result.usage.requests == 2


def test_cancelling_the_parent_cancels_its_children(pool: WorkerPool) -> None:
    with pool.client() as client:
        handle = client.submit(_cid("cancel"), "use slowpoke", agent="delegator")
        wait_until(lambda: handle.status() == "waiting", 60, what="the parent waiting")
        ids = child_ids(handle.conversation_id, handle.turn_id, "d1")
        call = {"conversation_id": ids.conversation_id, "turn_id": ids.turn_id}
        child = client.handle(call["conversation_id"], call["turn_id"])
        wait_until(lambda: _status(child) == "running", 60, what="the child running")
        assert handle.status() == "waiting"
        assert client.cancel(handle) == "cancelled"
        # Within a sweep period the running child is asked to stop, and stops at its next step.
        wait_until(lambda: _status(child) == "cancelled", 30, what="the child cancelled")
        assert handle.status() == "cancelled"


def test_a_person_cannot_decide_a_sub_agent_call(pool: WorkerPool) -> None:
    from convoq.errors import ProtocolError

    with pool.client() as client:
        handle = client.submit(_cid("person"), "use slowpoke", agent="delegator")
        wait_until(lambda: handle.status() == "waiting", 60, what="the parent waiting")
        with pytest.raises(ProtocolError, match="sub-agent call: its child turn decides it"):
            client.approve(handle, "d1")
        # Nor is it in the approvals inbox: nobody is asked.
        inbox = client.awaiting_approval(conversation_prefix=handle.conversation_id)
        assert [p.record.turn_id for p in inbox] == []
        client.cancel(handle)


def test_a_step_past_the_fan_out_limit_has_its_calls_refused(pool: WorkerPool) -> None:
    with pool.client() as client:
        handle = client.submit(_cid("wide"), "plan", agent="boss")
        result = handle.wait(90)
        events = list(handle.events(timeout=30))
    refused = "Error: at most 2 sub-agent calls may run at once (CONVOQ_SUBAGENT_MAX_FANOUT)"
    assert result.text.count(refused) == 3, result.text
    assert not any(e.type == "subagent_call" for e in events)


def test_a_wait_past_its_ttl_ends_the_parent_expired_and_cancels_the_child(
    pool: WorkerPool,
) -> None:
    with pool.client() as client:
        handle = client.submit(_cid("impatient"), "use slowpoke", agent="impatient")
        result = handle.wait(60, raise_on_error=False)
        assert result.status == "expired", result
        tool = [m.text for m in result.turn if m.role == "tool"]
        assert tool == ["Error: the sub-agent 'slowpoke' did not finish before the turn's wait"
                        " expired"]  # fmt: skip
        resumed = [e.data["reason"] for e in handle.events(timeout=30) if e.type == "resumed"]
        assert resumed == ["wait_expired"]
        ids = child_ids(handle.conversation_id, handle.turn_id, "d1")
        child = client.handle(ids.conversation_id, ids.turn_id)
        wait_until(lambda: _status(child) == "cancelled", 30, what="the child cancelled")


def test_the_parents_usage_sums_its_childrens_and_each_conversation_counts_its_own(
    pool: WorkerPool,
) -> None:
    from convoq.subagents import ParentCall
    from convoq.usage import Usage

    with pool.client() as client:
        handle = client.submit(_cid("tally"), "count", agent="tally")
        result = handle.wait(90)
        assert result.text == "metered + metered", result  # relay answers with its meter's
        # tally 101 + 220 (2 calls), relay 10 + 20 (2) with its meter 15 (1), meter 15 (1).
        assert result.usage.total_tokens == 381 and result.usage.requests == 6
        assert result.usage.prompt_tokens == 300 + 20 + 10 + 10
        children = {c.call_id: c for c in result.children}
        assert sorted(children) == ["m2", "t1"]
        relay, meter = children["t1"], children["m2"]
        assert (relay.agent, relay.status, relay.usage.total_tokens) == ("relay", "succeeded", 45)
        assert (meter.agent, meter.status, meter.usage.total_tokens) == ("meter", "succeeded", 15)
        ids = child_ids(handle.conversation_id, handle.turn_id, "t1")
        assert (relay.conversation_id, relay.turn_id) == (ids.conversation_id, ids.turn_id)
        # The counters: each conversation its own turns' calls, no child counted twice.
        assert client.usage(handle.conversation_id) == Usage(
            requests=2, prompt_tokens=300, completion_tokens=21, total_tokens=321
        )
        assert client.usage(relay.conversation_id).total_tokens == 30
        assert client.usage(meter.conversation_id).total_tokens == 15
        # A child's result names its parent call, and lists its own child.
        child = client.handle(relay.conversation_id, relay.turn_id).result()
        assert child.parent == ParentCall(handle.conversation_id, handle.turn_id, "t1", 1)
        assert [c.agent for c in child.children] == ["meter"] and result.parent is None
        assert child.usage.total_tokens == 45


gateway = module_gateway()


def test_the_family_shows_on_the_gateway_the_webhook_and_the_cli(
    pool: WorkerPool, gateway: GatewayProcess
) -> None:
    cid = _cid("tree")
    with webhook_receiver() as hooks, gateway.client() as http:
        body = {"message": "count", "agent": "tally", "callback_url": f"{hooks.url}/t"}
        accepted = http.post(turns_path(cid), json=body)
        assert accepted.status_code == 202, accepted.text
        tid = accepted.json()["turn_id"]
        view = http.get(f"{turns_path(cid)}/{tid}", params={"wait": 60}).json()
        posts = wait_until(lambda: hooks.posts("/t"), 60, what="the webhook")
        relay = child_ids(cid, tid, "t1")
        child = http.get(f"{turns_path(relay.conversation_id)}/{relay.turn_id}").json()
    assert view["status"] == "succeeded" and view["usage"]["total_tokens"] == 381, view
    listed = {c["call_id"]: c for c in view["children"]}
    assert listed["t1"] == {
        "call_id": "t1", "agent": "relay", "conversation_id": relay.conversation_id,
        "turn_id": relay.turn_id, "status": "succeeded", "usage": child["usage"],
    }  # fmt: skip
    assert listed["m2"]["usage"]["total_tokens"] == 15 and view["parent"] is None
    assert child["parent"] == {"conversation_id": cid, "turn_id": tid, "call_id": "t1", "depth": 1}
    payload = json.loads(posts[0][3])
    assert payload["usage"]["total_tokens"] == 381
    assert [(c["call_id"], c["agent"], c["status"]) for c in payload["children"]] == [
        ("t1", "relay", "succeeded"), ("m2", "meter", "succeeded"),
    ]  # fmt: skip
    assert payload["children"][0]["turn_id"] == relay.turn_id and payload["parent"] is None
    out = CliRunner().invoke(app, ["status", cid, tid], env=pool.env).output
    assert f"child t1 relay: succeeded, 3 model calls, {relay.conversation_id}" in out, out
    assert "usage with children: 340 prompt + 41 completion = 381 tokens" in out
    out = CliRunner().invoke(app, ["status", relay.conversation_id, relay.turn_id], env=pool.env)
    assert f"sub-agent call t1 of {cid} {tid}" in out.output, out.output


def test_a_child_parked_for_approval_is_in_the_inbox_with_its_parent_which_waits(
    pool: WorkerPool, gateway: GatewayProcess, redis_client: redis.Redis
) -> None:
    with pool.client() as client:
        handle = client.submit(_cid("buy"), "buy", agent="buyer")
        cid, tid = handle.conversation_id, handle.turn_id
        ids, metered = child_ids(cid, tid, "b1"), child_ids(cid, tid, "b2")
        child = client.handle(ids.conversation_id, ids.turn_id)
        wait_until(lambda: _status(child) == "awaiting_approval", 60, what="the child parked")
        other = client.handle(metered.conversation_id, metered.turn_id)
        wait_until(lambda: _status(other) == "succeeded", 60, what="the other child done")
        assert handle.status() == "waiting"  # for the child that waits for a person
        inbox = client.awaiting_approval(conversation_prefix=cid)
        assert [(p.record.turn_id, p.parent) for p in inbox] == [
            (ids.turn_id, {"conversation_id": cid, "turn_id": tid, "call_id": "b1", "depth": 1})
        ]
        with gateway.client() as http:
            listed = http.get("/v1/approvals").json()["turns"]
        shown = [a for a in listed if a["turn_id"] == ids.turn_id]
        assert [(a["parent"]["turn_id"], a["parent"]["call_id"]) for a in shown] == [(tid, "b1")]
        assert [c.id for c in child.result().pending_approvals] == ["p"]
        assert handle.status() == "waiting"
        client.approve(child, "p", by="alice")
        result = handle.wait(60)
        assert result.text == "paid 3 + metered", result
        assert [(c.call_id, c.status) for c in result.children] == [
            ("b1", "succeeded"), ("b2", "succeeded"),
        ]  # fmt: skip
        assert child.result().decisions["p"].by == "alice"
        resumed = [e for e in handle.events(timeout=30) if e.type == "resumed"]
        assert len(resumed) == 1  # once, when both children had ended
    prefix = f"{pool.prefix}:test:sub"
    assert redis_client.llen(f"{prefix}:pay_calls:{ids.conversation_id}") == 1


def test_a_step_waiting_for_a_person_and_a_child_resumes_once_when_both_decided(
    pool: WorkerPool, redis_client: redis.Redis
) -> None:
    with pool.client() as client:
        handle = client.submit(_cid("mixed"), "pay and count", agent="mixed")
        cid, tid = handle.conversation_id, handle.turn_id
        metered = child_ids(cid, tid, "x2")
        child = client.handle(metered.conversation_id, metered.turn_id)
        wait_until(lambda: _status(child) == "succeeded", 60, what="the child done")
        # The child decided its call; a person must still decide pay: parked for them.
        wait_until(lambda: "x2" in handle.result().decisions, 30, what="the child's call decided")
        assert handle.status() == "awaiting_approval"
        assert [c.id for c in handle.result().pending_approvals] == ["x1", "x2"]
        inbox = client.awaiting_approval(conversation_prefix=cid)
        assert [p.record.turn_id for p in inbox] == [tid]
        client.approve(handle, "x1", by="bob")
        result = handle.wait(60)
        assert result.text == "paid 5 + metered"
        assert [(c.call_id, c.status) for c in result.children] == [("x2", "succeeded")]
        resumed = [e for e in handle.events(timeout=30) if e.type == "resumed"]
        assert len(resumed) == 1
    prefix = f"{pool.prefix}:test:sub"
    assert redis_client.llen(f"{prefix}:pay_calls:{cid}") == 1

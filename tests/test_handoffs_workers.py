"""Handoffs on real workers: a turn handed to an agent this worker serves goes on here; to
one only another pool serves (two worker processes on different queues, one profile each)
it is queued again there, and the conversation's next turns run there too; workers killed
during and after the handoff lose and duplicate nothing; guardrails of the agent that
answers run on a turn that handed off."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from convoq.cli import app
from convoq.errors import GuardrailTripped
from convoq.memory import RedisConversationMemory
from tests.support.gateway import GatewayProcess, module_gateway, turns_path
from tests.support.redis_server import RedisServer
from tests.support.workers import (
    WorkerPool,
    WorkerProcess,
    supervised,
    wait_until,
    webhook_receiver,
)

AGENTS = "tests.support.handoff_agents"


def _pool(redis_server: RedisServer, logs: Path) -> WorkerPool:
    return WorkerPool(
        redis_server.url, logs, agents=AGENTS, lease_ms=3000, concurrency=2,
        agent_pools='{"billing": "billing"}',
    )  # fmt: skip


@pytest.fixture(scope="module")
def two_pools(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerPool]:
    """Pool A (the default queues) serves triage; pool B (queues of the pool "billing")
    serves billing."""
    pool = _pool(redis_server, tmp_path_factory.mktemp("handoffs"))
    a_env = {**pool.env, "HANDOFF_SERVE": "triage"}
    b_env = {**pool.env, "HANDOFF_SERVE": "billing", "CONVOQ_POOL": "billing"}
    try:
        for env in (a_env, b_env):
            worker = WorkerProcess(env, pool.log_dir).start()
            pool.workers.append(worker)
            worker.wait_ready()
        yield pool
    finally:
        pool.stop_all()


def _cid() -> str:
    return f"h-{uuid.uuid4().hex[:8]}"


def _calls(r: redis.Redis, pool: WorkerPool, agent: str, cid: str) -> tuple[int, set[int]]:
    key = f"{pool.prefix}:test:handoff:{agent}:{cid}"
    return int(r.get(key) or 0), {int(p) for p in r.lrange(key + ":pids", 0, -1)}


def _run(pool: WorkerPool, cid: str, text: str) -> Any:
    with pool.client() as client:
        handle = client.submit(cid, f"{cid}|{text}", agent="triage")
        result = handle.wait(90)
        events = list(handle.events(timeout=30))
        return result, events, handle.record()


def test_a_turn_handed_to_another_pool_finishes_there_and_the_next_turns_follow(
    two_pools: WorkerPool, redis_client: redis.Redis
) -> None:
    a, b = (w.pid for w in two_pools.workers)
    cid = _cid()
    result, events, record = _run(two_pools, cid, "a billing question")
    assert result.text == f"billing: {cid}|a billing question"
    assert (result.agent, result.handed_from) == ("billing", "triage")  # as wait() saw it
    handoffs = [e.data for e in events if e.type == "handoff"]
    assert handoffs == [{"call_id": "h", "from": "triage", "to": "billing"}]
    assert [e.data["reason"] for e in events if e.type == "resumed"] == ["handed_off"]
    assert (record.agent, record.handed_from) == ("billing", "triage")
    # Each model call ran once, on the pool of its agent.
    assert _calls(redis_client, two_pools, "triage", cid) == (1, {a})
    assert _calls(redis_client, two_pools, "billing", cid) == (1, {b})
    stored = RedisConversationMemory(two_pools.redis_url, prefix=two_pools.prefix).load(cid)
    assert [(m.role.value, m.name) for m in stored] == [
        ("user", None), ("assistant", "triage"), ("tool", "transfer_to_billing"),
        ("assistant", "billing"),
    ]  # fmt: skip
    # The next turn submitted for triage runs as billing, on pool B.
    result, events, record = _run(two_pools, cid, "more")
    assert result.text == f"billing: {cid}|more"
    handoffs = [e.data for e in events if e.type == "handoff"]
    assert handoffs == [{"call_id": None, "from": "triage", "to": "billing"}]
    assert (record.agent, record.handed_from) == ("billing", "triage")
    assert _calls(redis_client, two_pools, "triage", cid) == (1, {a})
    assert _calls(redis_client, two_pools, "billing", cid) == (2, {b})
    # Billing hands back: triage answers, and the next turn stays with triage.
    result, events, _ = _run(two_pools, cid, "go back")
    assert result.text == f"triage: {cid}|go back"
    result, _, record = _run(two_pools, cid, "hello")
    assert result.text == f"triage: {cid}|hello" and record.handed_from is None
    assert _calls(redis_client, two_pools, "triage", cid) == (3, {a})


@pytest.mark.timeout(240)
def test_workers_killed_during_and_after_a_handoff_lose_and_duplicate_nothing(
    two_pools: WorkerPool, redis_client: redis.Redis
) -> None:
    memory = RedisConversationMemory(two_pools.redis_url, prefix=two_pools.prefix)
    with supervised(two_pools):
        # Killed after the handoff's result was journaled, before the turn moved.
        cid = _cid()
        result, _, record = _run(two_pools, cid, "billing kill-tool")
        assert result.text == f"billing: {cid}|billing kill-tool"
        assert (record.agent, record.handed_from) == ("billing", "triage")
        assert _calls(redis_client, two_pools, "triage", cid)[0] == 1
        assert _calls(redis_client, two_pools, "billing", cid)[0] == 1
        assert len(memory.load(cid)) == 5  # user, handoff step, its two results, answer
        # Killed after the move, in the target's model call: the sweeper of pool A kicks
        # the turn on pool B's queue, where it runs again.
        cid = _cid()
        result, _events, _record = _run(two_pools, cid, "billing kill-billing")
        assert result.text == f"billing: {cid}|billing kill-billing"
        assert _calls(redis_client, two_pools, "triage", cid)[0] == 1
        assert _calls(redis_client, two_pools, "billing", cid)[0] == 2
        assert [m.role.value for m in memory.load(cid)] == [
            "user",
            "assistant",
            "tool",
            "assistant",
        ]


def test_a_submit_goes_to_the_pool_of_its_agent(
    two_pools: WorkerPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that knows the pools (CONVOQ_AGENT_POOLS) kicks a turn for billing on pool
    B's queue; one that does not kicks the default queue, and pool A passes it on."""
    for knows in (True, False):
        if knows:
            monkeypatch.setenv("CONVOQ_AGENT_POOLS", '{"billing": "billing"}')
        else:
            monkeypatch.delenv("CONVOQ_AGENT_POOLS", raising=False)
        cid = _cid()
        with two_pools.client() as client:
            handle = client.submit(cid, f"{cid}|hi", agent="billing")
            result = handle.wait(60)
            events = list(handle.events(timeout=30))
            record = handle.record()
        assert result.text == f"billing: {cid}|hi"
        resumed = [e.data["reason"] for e in events if e.type == "resumed"]
        assert resumed == ([] if knows else ["handed_off"])
        assert not [e for e in events if e.type == "handoff"]
        assert (record.agent, record.handed_from) == ("billing", None)


def test_the_output_guardrails_of_the_agent_that_answers_run(two_pools: WorkerPool) -> None:
    cid = _cid()
    with two_pools.client() as client:
        handle = client.submit(cid, f"{cid}|billing forbidden", agent="triage")
        with pytest.raises(GuardrailTripped) as tripped:
            handle.wait(90)
    assert tripped.value.details["guardrail"] == "no_forbidden"
    assert RedisConversationMemory(two_pools.redis_url, prefix=two_pools.prefix).load(cid) == []


def test_one_worker_serving_both_goes_on_itself(
    redis_server: RedisServer, tmp_path: Path, redis_client: redis.Redis
) -> None:
    pool = _pool(redis_server, tmp_path)
    pool.env.pop("CONVOQ_AGENT_POOLS")
    try:
        (worker,) = pool.start(1)
        cid = _cid()
        result, events, _record = _run(pool, cid, "billing please")
        assert result.text == f"billing: {cid}|billing please"
        assert [e.data["to"] for e in events if e.type == "handoff"] == ["billing"]
        assert not [e for e in events if e.type == "resumed"]  # went on in the same run
        assert _calls(redis_client, pool, "triage", cid) == (1, {worker.pid})
        assert _calls(redis_client, pool, "billing", cid) == (1, {worker.pid})
    finally:
        pool.stop_all()


@pytest.fixture(scope="module")
def pool(two_pools: WorkerPool) -> WorkerPool:
    return two_pools


gateway = module_gateway()


def test_the_handoff_shows_on_the_gateway_the_webhook_and_the_cli(
    pool: WorkerPool, gateway: GatewayProcess
) -> None:
    cid = _cid()
    with webhook_receiver() as hooks, gateway.client() as http:
        body = {"message": f"{cid}|billing", "agent": "triage", "callback_url": f"{hooks.url}/h"}
        accepted = http.post(turns_path(cid), json=body)
        assert accepted.status_code == 202, accepted.text
        tid = accepted.json()["turn_id"]
        view = http.get(f"{turns_path(cid)}/{tid}", params={"wait": 60}).json()
        posts = wait_until(lambda: hooks.posts("/h"), 60, what="the webhook")
    assert (view["status"], view["agent"], view["handed_from"]) == (
        "succeeded",
        "billing",
        "triage",
    )
    assert [(m["role"], m.get("name")) for m in view["messages"]] == [
        ("assistant", "triage"), ("tool", "transfer_to_billing"), ("assistant", "billing"),
    ]  # fmt: skip
    payload = json.loads(posts[0][3])
    assert (payload["agent"], payload["handed_from"]) == ("billing", "triage")
    out = CliRunner().invoke(app, ["status", cid, tid], env=pool.env).output
    assert "handed off: triage -> billing" in out, out

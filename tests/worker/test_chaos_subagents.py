"""Chaos, sub-agents: parents fan out to three child turns each (one child's tool needs a
person's approval, which the test gives from the approvals inbox; the others' tool is
slow) while workers are killed (-9) and redis-server is killed (-9) and restarted from
its AOF.

No child may be lost or made twice (each child conversation holds its one turn), every
parent resumes exactly once with all its children's answers, each side-effecting tool's
distinct effects downstream equal its calls (its idempotency key is the same on every run
of a call), and each conversation's turns are stored in submission order. Workers that
exit are restarted, as a supervisor would (see ``test_chaos_full``).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
import redis

from convoq import Client
from convoq.client import TurnHandle, TurnResult
from convoq.context import idempotency_key
from convoq.messages import MessageRole
from convoq.subagents import child_ids
from tests.support.redis_server import RedisServer
from tests.support.workers import (
    WorkerPool,
    WorkerProcess,
    running_pool,
    supervised,
    wait_until,
)

pytestmark = pytest.mark.slow

CONVERSATIONS, TURNS = 5, 3
CALLS = {"s": "sign", "d1": "act", "d2": "act"}  # the parent's calls and their child's tool
SEED = 20261202


def test_parents_and_children_survive_worker_and_redis_kills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = RedisServer(tmp_path / "api")
    api.start()
    monkeypatch.setenv("CHAOS_EFFECTS_URL", api.url)  # the workers inherit it
    server = RedisServer(tmp_path / "redis")
    server.start()
    effects = redis.Redis.from_url(api.url)
    kills: list[int] = []
    try:
        with running_pool(
            server.url, tmp_path, 3, agents="tests.support.subagent_chaos_agents",
            lease_ms=2000, concurrency=4, sweep_interval_s=0.5, max_attempts=50,
            shutdown_grace_s=1,
        ) as pool, pool.client() as client, supervised(pool):  # fmt: skip
            stop = threading.Event()
            approver = threading.Thread(target=_approve_all, args=(client, pool, stop))
            approver.start()
            handles: dict[str, list[TurnHandle]] = {}
            submitter = threading.Thread(target=_submit_all, args=(client, pool, handles))
            submitter.start()
            try:
                _chaos(pool, server, effects, kills)
                submitter.join(60)
                assert not submitter.is_alive(), "the submissions did not end"
                results = {cid: [h.wait(120) for h in mine] for cid, mine in handles.items()}
            finally:
                stop.set()
                approver.join(30)
            _check(client, handles, results, effects, len(kills))
    finally:
        effects.close()
        server.stop()
        api.stop()


def _submit_all(client: Client, pool: WorkerPool, handles: dict[str, list[TurnHandle]]) -> None:
    """Round by round, one parent turn per conversation, while the chaos goes on: a submit
    that meets Redis down is sent again with its idempotency key, as a client would."""
    for t in range(TURNS):
        for c in range(CONVERSATIONS):
            cid = f"{pool.prefix[-6:]}-fan-{c}"
            handles.setdefault(cid, []).append(_submit(client, cid, f"c{c}t{t}"))
        time.sleep(1.5)


def _submit(client: Client, cid: str, text: str) -> TurnHandle:
    deadline = time.monotonic() + 60
    while True:
        try:
            return client.submit(cid, text, agent="fanner", idempotency_key=text)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _approve_all(client: Client, pool: WorkerPool, stop: threading.Event) -> None:
    """A person at the approvals inbox: approves every call waiting there (the inbox is
    read again and again; Redis may be down meanwhile, then the next pass tries again)."""
    while not stop.wait(0.2):
        try:
            for parked in client.awaiting_approval(conversation_prefix=pool.prefix[-6:]):
                assert parked.parent is not None  # only children ask here
                record = parked.record
                for call in (record.result or {}).get("pending_approvals") or []:
                    if call["id"] not in record.decisions:
                        handle = client.handle(record.conversation_id, record.turn_id)
                        client.approve(handle, call["id"], by="chaos")
        except AssertionError:
            raise
        except Exception:  # Redis down, or decided meanwhile: the next pass sees
            continue


def _chaos(pool: WorkerPool, server: RedisServer, effects: redis.Redis, kills: list[int]) -> None:
    """Two workers killed inside a child's tool, Redis killed -9 and restarted, and one
    more worker killed."""
    for _ in range(2):
        kills.append(_kill_inside(pool, effects))
        time.sleep(1.0)
    server.kill()  # kill -9; AOF (fsync always) keeps what was acknowledged
    time.sleep(1.0)
    server.start()
    time.sleep(1.0)
    victim = random.Random(SEED).choice([w for w in pool.workers if w.alive()])
    kills.append(victim.pid)
    victim.kill()


def _kill_inside(pool: WorkerPool, effects: redis.Redis) -> int:
    """Kill -9 a live worker that is inside ``act`` right now; its pid."""
    found: list[WorkerProcess] = []

    def inside() -> bool:
        running = {int(pid): int(n) for pid, n in effects.hgetall("inside").items()}
        found[:] = [w for w in pool.workers if w.alive() and running.get(w.pid, 0) > 0]
        return bool(found)

    wait_until(inside, 60, what="a worker inside a child's tool")
    found[0].kill()
    return found[0].pid


def _check(
    client: Client,
    handles: dict[str, list[TurnHandle]],
    results: dict[str, list[TurnResult]],
    effects: redis.Redis,
    kills: int,
) -> None:
    expected: dict[str, set[str]] = {"sign": set(), "act": set()}
    resumes: list[int] = []
    takeovers = 0
    for cid, mine in handles.items():
        texts = [h_result.text for h_result in results[cid]]
        asked = [f"c{cid.rsplit('-', 1)[1]}t{t}" for t in range(TURNS)]
        assert texts == [_answer(q) for q in asked]
        users = [m.text for m in client.history(cid) if m.role == MessageRole.USER]
        assert users == asked  # in order, none lost or doubled
        for handle, result, q in zip(mine, results[cid], asked, strict=True):
            assert [(c.call_id, c.status) for c in result.children] == [
                (call, "succeeded") for call in CALLS
            ]
            events = list(handle.events(timeout=30))
            reasons = [e.data["reason"] for e in events if e.type == "resumed"]
            resumes.append(reasons.count("children_done"))  # others: runs taken over
            takeovers += len(reasons) - resumes[-1]
            for call, tool_name in CALLS.items():
                child = child_ids(cid, handle.turn_id, call)
                stored = client.history(child.conversation_id)
                assert [m.text for m in stored if m.role == MessageRole.USER] == [f"{q} {call}"]
                expected[tool_name].add(
                    idempotency_key(child.conversation_id, child.turn_id, 1, "x")
                )
    runs = {name: [k.decode() for k in effects.lrange(f"executions:{name}", 0, -1)]
            for name in expected}  # fmt: skip
    applied = {name: {k.decode() for k in effects.smembers(f"effects:{name}")} for name in expected}
    print(
        f"\nchaos sub-agents: {sum(map(len, results.values()))} parents, "
        f"{sum(map(len, expected.values()))} children, {kills} worker kills, 1 redis kill -9"
        f" + restart; executions act {len(runs['act'])} / sign {len(runs['sign'])} for"
        f" {len(expected['act'])} / {len(expected['sign'])} calls; resumes per parent"
        f" {sorted(set(resumes))}, parent runs taken over {takeovers}"
    )
    assert resumes == [1] * len(resumes)  # every parent resumed once, when its children ended
    for name, keys in expected.items():
        assert applied[name] == keys == set(runs[name])  # distinct effects == calls
        assert len(keys) == CONVERSATIONS * TURNS * list(CALLS.values()).count(name)
    assert len(runs["act"]) > len(expected["act"])  # the kills cut calls off: some ran twice


def _answer(q: str) -> str:
    return " + ".join(sorted([f"signed {q} s", f"did {q} d1", f"did {q} d2"]))

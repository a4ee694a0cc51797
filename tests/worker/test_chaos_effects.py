"""Chaos, side effects: worker processes killed (-9) while they are inside a slow tool that
pays through an API deduplicating on ``ctx.idempotency_key`` (a second redis-server that
is never killed plays that API).

A tool call cut off mid-way runs again on another worker: executions may exceed tool
calls. Its key must be the same on every run (derived from conversation, turn, step and
the call id the journaled assistant message fixed), so the API applies each payment once:
distinct effects == tool calls == the keys the stored history implies, and no effect is
applied twice. Workers are restarted as a supervisor would (see ``test_chaos_full``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis

from convoq import Client
from convoq.client import TurnHandle
from convoq.context import idempotency_key
from convoq.messages import MessageRole
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool, running_pool, supervised, wait_until

pytestmark = pytest.mark.slow

CONVERSATIONS, TURNS, KILLS = 8, 4, 5
LEASE_MS = 2000


def test_effects_happen_once_downstream_while_workers_die_inside_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer
) -> None:
    api = RedisServer(tmp_path / "payment-api")
    api.start()
    monkeypatch.setenv("CHAOS_EFFECTS_URL", api.url)  # the workers inherit it
    effects = redis.Redis.from_url(api.url)
    try:
        with running_pool(
            redis_server.url, tmp_path, 3, agents="tests.support.chaos_agents",
            lease_ms=LEASE_MS, sweep_interval_s=0.5, max_attempts=50, concurrency=4,
        ) as pool, pool.client() as client, supervised(pool):  # fmt: skip
            handles = {f"pay-{c}-{_suffix(pool)}": [] for c in range(CONVERSATIONS)}
            submitter = threading.Thread(target=_submit_all, args=(client, handles))
            submitter.start()
            try:
                kills = _kill_inside_tools(pool, effects)
            finally:
                submitter.join(120)
            _check(client, handles, effects, kills)
    finally:
        effects.close()
        api.stop()


def _suffix(pool: WorkerPool) -> str:
    return pool.prefix[-6:]


def _submit_all(client: Client, handles: dict[str, list[TurnHandle]]) -> None:
    for t in range(TURNS):
        for cid, mine in handles.items():
            mine.append(client.submit(cid, f"{cid} t{t}", agent="payer"))
        time.sleep(0.5)


def _kill_inside_tools(pool: WorkerPool, effects: redis.Redis) -> int:
    """Kill -9, KILLS times, a live worker that is inside ``pay_once`` right now."""
    kills = 0
    for _ in range(KILLS):
        victim = None

        def inside() -> bool:
            nonlocal victim
            running = {int(pid): int(n) for pid, n in effects.hgetall("inside").items()}
            busy = [w for w in pool.workers if w.alive() and running.get(w.pid, 0) > 0]
            victim = busy[0] if busy else None
            return victim is not None

        wait_until(inside, 60, what="a worker inside the tool")
        assert victim is not None
        victim.kill()
        kills += 1
        time.sleep(1.0)  # let the conversation move on before the next kill
    return kills


def _check(
    client: Client, handles: dict[str, list[TurnHandle]], effects: redis.Redis, kills: int
) -> None:
    expected_keys: set[str] = set()
    calls = 0
    for cid, mine in handles.items():
        results = [h.wait(120) for h in mine]  # raises if any turn failed
        assert [r.text for r in results] == [f"paid: {cid} t{t}" for t in range(TURNS)]
        for handle, result in zip(mine, results, strict=True):
            [asked] = [m for m in result.turn if m.role == MessageRole.ASSISTANT and m.tool_calls]
            [call] = asked.tool_calls
            calls += 1
            expected_keys.add(idempotency_key(cid, handle.turn_id, 1, call.id))
        stored = [m.text for m in client.history(cid) if m.role == MessageRole.USER]
        assert stored == [f"{cid} t{t}" for t in range(TURNS)]  # none lost, duplicated, moved
    executions = [k.decode() for k in effects.lrange("executions", 0, -1)]
    applied = [k.decode() for k in effects.lrange("applied", 0, -1)]
    effect_keys = {k.decode().removeprefix("effect:") for k in effects.scan_iter("effect:*")}
    print(
        f"\nchaos effects: {calls} tool calls in {calls} turns, {kills} workers killed inside"
        f" the tool; {len(executions)} executions ({len(executions) - calls} reruns),"
        f" {len(set(executions))} distinct keys, {len(applied)} effects applied,"
        f" {len(applied) - len(set(applied))} duplicated"
    )
    assert calls == CONVERSATIONS * TURNS
    assert len(executions) >= calls and set(executions) == expected_keys
    assert len(executions) > calls  # the kills cut tools off: some calls ran twice
    assert effect_keys == expected_keys == set(applied)
    assert len(applied) == calls  # each payment applied once: 0 duplicated effects

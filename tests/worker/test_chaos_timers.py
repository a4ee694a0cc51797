"""Chaos, scheduled turns: 500 turns scheduled over about 40 s across 25 conversations,
while workers are killed (-9) and redis-server is killed (-9) and restarted from its AOF
(appendfsync always). Workers that exit are restarted, as a supervisor would.

Each turn fires exactly once (one "queued" event, its record's ``fired_ms``), none early
(fired and started at or after its due time, both by Redis's clock, recorded at fire and
at start), each conversation stores its turns once each in due order, and the lateness
of the fires (fired - due) is printed as p50/p99/max (the slowest within 10 s).
"""

from __future__ import annotations

import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from convoq import Client
from convoq.client import TurnHandle
from convoq.messages import MessageRole
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool, running_pool, supervised

pytestmark = pytest.mark.slow

CONVERSATIONS, PER_CONVERSATION = 25, 20  # 500 scheduled turns
SPREAD_S, LEAD_S = 40.0, 4.0  # due times: LEAD_S to LEAD_S + SPREAD_S from the start
SEED = 20261202


def test_scheduled_turns_fire_once_in_order_and_never_early_through_kills(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    kills: list[int] = []
    try:
        with running_pool(
            server.url, tmp_path, 3, agents="tests.support.schedule_agents", lease_ms=2000,
            concurrency=4, sweep_interval_s=0.5, timer_interval_s=0.5, max_attempts=50,
            shutdown_grace_s=1,
        ) as pool, pool.client() as client, supervised(pool):  # fmt: skip
            started = time.monotonic()
            planned = _schedule_all(client, pool)
            scheduled_s = time.monotonic() - started
            _chaos(pool, server, kills, started)
            handles = [h for mine in planned.values() for h, _ in mine]
            for handle in handles:
                handle.wait(120, until="final")
            _check(client, planned, len(kills), scheduled_s, time.monotonic() - started)
    finally:
        server.stop()


def _schedule_all(client: Client, pool: WorkerPool) -> dict[str, list[tuple[TurnHandle, str]]]:
    """Every turn scheduled at once, its due time spread over SPREAD_S (distinct within a
    conversation, in no particular order of submission); each conversation's (handle,
    text) in due order."""
    rng = random.Random(SEED)
    start = datetime.now(UTC) + timedelta(seconds=LEAD_S)
    planned: dict[str, list[tuple[datetime, TurnHandle, str]]] = {}
    jobs = [(c, t) for c in range(CONVERSATIONS) for t in range(PER_CONVERSATION)]
    rng.shuffle(jobs)
    for c, t in jobs:
        cid = f"{pool.prefix[-6:]}-timers-{c}"
        due = start + timedelta(milliseconds=rng.randrange(int(SPREAD_S * 1000)) + t)
        text = f"c{c} t{t} {due.isoformat()}"
        handle = client.submit(cid, text, agent="echo", not_before=due, idempotency_key=text)
        planned.setdefault(cid, []).append((due, handle, text))
    return {cid: [(h, text) for _, h, text in sorted(mine, key=lambda x: x[0])]
            for cid, mine in planned.items()}  # fmt: skip


def _chaos(pool: WorkerPool, server: RedisServer, kills: list[int], started: float) -> None:
    """Workers killed at 8 s, 16 s and 32 s; redis-server killed -9 at 24 s and started
    again a second later (from its AOF)."""
    rng = random.Random(SEED)

    def at(second: float) -> None:
        time.sleep(max(0.0, started + second - time.monotonic()))

    for second in (8.0, 16.0, None, 32.0):
        if second is None:
            at(24.0)
            server.kill()  # kill -9; AOF (fsync always) keeps what was acknowledged
            time.sleep(1.0)
            server.start()
            continue
        at(second)
        victim = rng.choice([w for w in pool.workers if w.alive()])
        kills.append(victim.pid)
        victim.kill()


def _check(
    client: Client,
    planned: dict[str, list[tuple[TurnHandle, str]]],
    kills: int,
    scheduled_s: float,
    wall_s: float,
) -> None:
    late_fired: list[int] = []
    late_started: list[int] = []
    for cid, mine in planned.items():
        users = [m.text for m in client.history(cid) if m.role == MessageRole.USER]
        assert users == [text for _, text in mine]  # in due order, none lost or doubled
        for handle, text in mine:
            record = handle.record()
            assert record.status == "succeeded", (text, record.error)
            assert record.due_ms is not None and record.fired_ms is not None
            assert record.started_ms is not None
            assert record.fired_ms >= record.due_ms  # never early, by Redis's clock
            assert record.started_ms >= record.due_ms
            events = list(handle.events(timeout=30))
            queued = [e for e in events if e.type == "status" and e.data["status"] == "queued"]
            assert len(queued) == 1 and queued[0].data["fired_ms"] == record.fired_ms
            late_fired.append(record.fired_ms - record.due_ms)
            late_started.append(record.started_ms - record.due_ms)
    assert len(late_fired) == CONVERSATIONS * PER_CONVERSATION
    fired = _percentiles(late_fired)
    began = _percentiles(late_started)
    # Polled every 0.5 s; the slowest are those due while Redis was down (about a second).
    assert fired[2] < 10_000, fired
    print(
        f"\nchaos timers: {len(late_fired)} scheduled turns in {CONVERSATIONS} conversations"
        f" (scheduled in {scheduled_s:.1f} s), {kills} worker kills, 1 redis kill -9 +"
        f" restart, {wall_s:.0f} s; lateness fired-due ms p50 {fired[0]} p99 {fired[1]}"
        f" max {fired[2]}; started-due ms p50 {began[0]} p99 {began[1]} max {began[2]}"
    )


def _percentiles(values: list[int]) -> tuple[int, int, int]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return round(cuts[49]), round(cuts[98]), max(values)

"""Chaos, the full profile: three workers on short leases while workers are killed (-9),
one is paused past its lease (SIGSTOP, then SIGCONT: the stale holder wakes up and is
refused), redis-server is killed (-9) and restarted from its AOF, a tenth of the turns
are submitted twice with one idempotency key, and every turn runs a side-effecting tool.

Nothing a client was told is queued may be lost, stored twice, reordered or failed. A
tool may run twice only when the run that first ran it was cut off (its worker killed,
paused or gone): a journaled step never reruns, and a Redis restart inside a lease makes
the runner retry its journal write instead of giving the turn up. The figures (turns,
kills, pauses, restarts, tool reruns) are printed for the record.

Workers that exit on their own when their broker connection drops are restarted, as a
supervisor would (see ``test_chaos.py``).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from convoq import Client
from convoq.client import TurnHandle
from tests.support.chaos_check import tally
from tests.support.redis_server import RedisServer
from tests.support.workers import (
    WorkerPool,
    WorkerProcess,
    running_pool,
    supervised,
    wait_until,
)

pytestmark = pytest.mark.slow

CONVERSATIONS, TURNS, DUPLICATE_SHARE = 12, 8, 0.1
LEASE_MS, CONCURRENCY = 3000, 4
SEED = 20261130
REFUSED = ("abandoned", "nothing was written")


@dataclass
class Chaos:
    """What was done to the system, and which worker processes were cut off by it."""

    kills: int = 0
    pauses: int = 0
    redis_restarts: int = 0
    exits: int = 0  # workers that exited on their own (broker connection lost)
    duplicates: int = 0
    cut_off: set[int] = field(default_factory=set)  # pids killed, paused or exited
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note_exit(self, worker: WorkerProcess) -> None:
        """Count a worker that exited on its own (one the chaos cut off is counted there)."""
        with self.lock:
            if worker.pid not in self.cut_off:
                self.exits += 1
                self.cut_off.add(worker.pid)


def test_full_chaos_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool_log = tmp_path / "tool-runs.log"
    tool_log.touch()
    monkeypatch.setenv("CHAOS_TOOL_LOG", str(tool_log))  # the workers inherit it
    server = RedisServer(tmp_path / "redis")
    server.start()
    chaos = Chaos()
    try:
        with running_pool(
            server.url, tmp_path, 3, agents="tests.support.chaos_agents",
            lease_ms=LEASE_MS, concurrency=CONCURRENCY, sweep_interval_s=0.5,
            max_attempts=50, shutdown_grace_s=1,
        ) as pool, pool.client() as client, supervised(pool, chaos.note_exit):  # fmt: skip
            handles = _run(pool, server, client, chaos)
            _check(client, handles, tool_log, chaos)
    finally:
        server.stop()


def _run(
    pool: WorkerPool, server: RedisServer, client: Client, chaos: Chaos
) -> dict[str, list[TurnHandle]]:
    handles: dict[str, list[TurnHandle]] = {}
    submitter = threading.Thread(target=_submit_all, args=(client, handles, chaos))
    submitter.start()
    rng = random.Random(SEED)
    try:
        time.sleep(1.5)
        _kill_one(pool, rng, chaos)
        time.sleep(1.0)
        _pause_a_holder(pool, server, rng, chaos)
        time.sleep(0.5)
        server.kill()  # redis-server kill -9, restarted from its AOF
        time.sleep(1.0)
        server.start()
        chaos.redis_restarts += 1
        time.sleep(1.5)
        _kill_one(pool, rng, chaos)
    finally:
        submitter.join(120)
    assert not submitter.is_alive(), "the submissions did not end"
    return handles


def _submit_all(client: Client, handles: dict[str, list[TurnHandle]], chaos: Chaos) -> None:
    """Round by round, one turn per conversation; a tenth of them sent twice with the same
    idempotency key (a client retrying), and any submission that meets Redis down retried
    with its key, as a client would."""
    rng = random.Random(SEED + 1)
    for t in range(TURNS):
        for c in range(CONVERSATIONS):
            cid, key = f"chaos-{c}", f"c{c}-t{t}"
            handle = _submit(client, cid, f"c{c} t{t}", key)
            if rng.random() < DUPLICATE_SHARE:
                again = _submit(client, cid, f"c{c} t{t}", key)
                assert again.turn_id == handle.turn_id, key
                chaos.duplicates += 1
            handles.setdefault(cid, []).append(handle)
        time.sleep(0.6)


def _submit(client: Client, cid: str, text: str, key: str) -> TurnHandle:
    deadline = time.monotonic() + 60
    while True:
        try:
            return client.submit(cid, text, agent="effect", idempotency_key=key)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _kill_one(pool: WorkerPool, rng: random.Random, chaos: Chaos) -> None:
    live = [w for w in pool.workers if w.alive()]
    victim = rng.choice(live)
    with chaos.lock:
        chaos.cut_off.add(victim.pid)
        chaos.kills += 1
    victim.kill()


def _pause_a_holder(
    pool: WorkerPool, server: RedisServer, rng: random.Random, chaos: Chaos
) -> None:
    """SIGSTOP a worker that holds a lease, past its lease; then SIGCONT. It wakes up still
    believing it runs its turn, and its writes must be refused (its fence is stale)."""
    victim = _a_lease_holder(pool, server) or rng.choice([w for w in pool.workers if w.alive()])
    with chaos.lock:
        chaos.cut_off.add(victim.pid)
        chaos.pauses += 1
    os.kill(victim.pid, signal.SIGSTOP)
    time.sleep(LEASE_MS / 1000 + 2.0)  # the lease lapses; another worker takes the turn
    os.kill(victim.pid, signal.SIGCONT)
    # Refused either way: its lease found lost ("abandoned"), or its turn found ended by
    # the worker that took over (a fenced write refused: "nothing was written").
    wait_until(
        lambda: any(said in victim.log_tail(400) for said in REFUSED),
        60,
        what="the woken worker to be refused",
    )


def _a_lease_holder(pool: WorkerPool, server: RedisServer) -> WorkerProcess | None:
    r = redis.Redis.from_url(server.url)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for key in r.scan_iter(match=f"{pool.prefix}:*:lease"):
                holder = (r.hget(key, "holder") or b"").decode()
                for worker in pool.workers:
                    if worker.alive() and holder.endswith(f":{worker.pid}"):
                        return worker
            time.sleep(0.05)
        return None
    finally:
        r.close()


def _check(
    client: Client, handles: dict[str, list[TurnHandle]], tool_log: Path, chaos: Chaos
) -> None:
    expected = {f"chaos-{c}": [f"c{c} t{t}" for t in range(TURNS)] for c in range(CONVERSATIONS)}
    found = tally(client, handles, expected, tool_log)
    print(
        f"\nchaos: {found.turns} turns ({chaos.duplicates} submitted twice), 3 workers, lease"
        f" {LEASE_MS} ms; {chaos.kills} worker kills, {chaos.pauses} pauses past the lease,"
        f" {chaos.redis_restarts} redis kill -9 + restart, {chaos.exits} workers exited on"
        f" their own; {found.summary()}"
    )
    found.assert_held(chaos.cut_off)

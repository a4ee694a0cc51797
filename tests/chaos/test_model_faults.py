"""Chaos, model faults: every turn's model is a Chat Completions server over HTTP that
fails on purpose (:class:`~tests.support.model_faults.FaultyWireServer`: 429 storms with
``Retry-After``, 503s, hangs past the attempt deadline, streams dropped part way, closed
or reset, before any text or after some went out) while worker processes are killed
(-9) and restarted, as a supervisor would.

No model call gets more faults than its ``max_retries``, so no turn may fail: a retry
saves every one. One turn more is refused its final answer past its budget: it fails,
and retried as the same turn once the server is well, it succeeds from its journal.
What must hold besides every chaos invariant (:mod:`tests.support.chaos_check`): no call
makes more requests than ``1 + max_retries`` (the refused one makes exactly that many);
a retry after 429 waits ``Retry-After``; a hang is given up on at the attempt deadline
and retried; no call ends on a fault while its worker lives. The figures are printed.
"""

from __future__ import annotations

import collections
import random
import threading
import time
from pathlib import Path

import pytest
import redis

from convoq import Client
from convoq.client import TurnHandle
from tests.support import model_fault_agents as agents
from tests.support.chaos_check import (
    leftover_keys,
    on_partitions,
    own_partitions,
    tally,
    wedged_workers,
)
from tests.support.model_faults import KINDS, FaultyWireServer, Plan, Promises
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool, running_pool, supervised

pytestmark = pytest.mark.slow

CONVERSATIONS, TURNS, KILLS = 8, 4, 3
WORKERS, SHARED = 3, 4
LEASE_MS = 2000
SEED = 20261203


def test_model_faults_while_workers_die_fail_no_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer
) -> None:
    tool_log = tmp_path / "tool-runs.log"
    tool_log.touch()
    plan = Plan(budget=agents.MAX_RETRIES)
    with FaultyWireServer(agents.answer, plan) as model_server:
        monkeypatch.setenv("CHAOS_TOOL_LOG", str(tool_log))  # the workers inherit both
        monkeypatch.setenv("CHAOS_MODEL_URL", model_server.url)
        killed: set[int] = set()
        with running_pool(
            redis_server.url, tmp_path, 0, agents="tests.support.chaos_agents,"
            "tests.support.model_fault_agents", partitions=SHARED + WORKERS,
            lease_ms=LEASE_MS, sweep_interval_s=0.5, max_attempts=50, concurrency=4,
            shutdown_grace_s=1,
        ) as pool, pool.client() as client:  # fmt: skip
            for spec in own_partitions(WORKERS, SHARED):
                pool.start(1, partitions=spec)
            cids = on_partitions(CONVERSATIONS, f"faults-{pool.prefix[-6:]}", range(SHARED),
                                 SHARED + WORKERS)  # fmt: skip
            with supervised(pool):
                handles = _run(pool, client, cids, killed)
                over = _over_budget_then_retried(client, model_server, cids[0], tool_log)
                handles[over.conversation_id] = [over]
                _check(pool, client, model_server, handles, tool_log, killed)


def _run(
    pool: WorkerPool, client: Client, cids: list[str], killed: set[int]
) -> dict[str, list[TurnHandle]]:
    handles: dict[str, list[TurnHandle]] = {cid: [] for cid in cids}

    def submit_all() -> None:
        for t in range(TURNS):
            for cid in cids:
                handles[cid].append(client.submit(cid, f"{cid} t{t}", agent="faulty"))
            time.sleep(0.8)

    submitter = threading.Thread(target=submit_all)
    submitter.start()
    rng = random.Random(SEED)
    try:
        for _ in range(KILLS):
            time.sleep(2.0)
            victim = rng.choice([w for w in pool.workers if w.alive()])
            killed.add(victim.pid)
            victim.kill()
    finally:
        submitter.join(60)
    assert not submitter.is_alive(), "the submissions did not end"
    return handles


def _over_budget_then_retried(
    client: Client, server: FaultyWireServer, like: str, tool_log: Path
) -> TurnHandle:
    """A turn whose final answer fails past its budget fails (503 after its retries); the
    server well again, it is retried as the same turn and succeeds from its journal (its
    tool does not run again: the tally counts one execution)."""
    cid = f"{like}-over"
    server.refuse.add(f"{cid} t0")
    handle = client.submit(cid, f"{cid} t0", agent="faulty")
    failed = handle.wait(60, raise_on_error=False)
    assert failed.status == "failed" and "answered HTTP 503" in str(failed.error), failed
    server.refuse.clear()
    handle.retry()
    result = handle.wait(60)
    assert (result.retries, result.text) == (1, f"seen: {cid} t0")
    ran = [line for line in tool_log.read_text().splitlines() if line.startswith(f"{cid} t0\t")]
    assert len(ran) == 1, ran  # its journal kept the tool's result: it did not run again
    return handle


def _check(
    pool: WorkerPool,
    client: Client,
    server: FaultyWireServer,
    handles: dict[str, list[TurnHandle]],
    tool_log: Path,
    killed: set[int],
) -> None:
    expected = {cid: [f"{cid} t{t}" for t in range(len(hs))] for cid, hs in handles.items()}
    found = tally(client, handles, expected, tool_log)
    final_at = time.monotonic()
    store = redis.Redis.from_url(pool.redis_url)
    try:
        left = leftover_keys(store, pool.prefix, list(handles))
    finally:
        store.close()
    wedged = wedged_workers(client, pool.workers, SHARED)
    hits = list(server.hits)
    faults = collections.Counter(h.fault for h in hits if h.fault)
    calls = collections.Counter(h.call for h in hits)
    max_backoff = agents.RETRY_BASE_DELAY_S * 2 ** (agents.MAX_RETRIES - 1)
    promises = Promises(agents.MAX_RETRIES, agents.ATTEMPT_TIMEOUT_S, max_backoff)
    broken = promises.broken(hits, killed)
    retracted = sum(
        event.type == "text_retracted"
        for hs in handles.values()
        for handle in hs
        for event in client.handle(handle.conversation_id, handle.turn_id).events(timeout=30)
    )
    print(
        f"\nmodel faults: {found.turns} turns, {WORKERS} workers, {len(killed)} killed (-9);"
        f" {len(hits)} model requests in {len(calls)} calls, faults"
        f" {dict(sorted(faults.items()))}; requests per call at most {max(calls.values())}"
        f" (budget 1 + {agents.MAX_RETRIES}); all turns final"
        f" {max(0.0, final_at - server.last_fault_at()):.1f} s after the last fault;"
        f" {found.summary()}; leftover keys {len(left)}, wedged workers {len(wedged)},"
        f" broken retry promises {len(broken)}; text streams dropped {server.text_drops},"
        f" text retracted before a retry {retracted} times"
    )
    found.assert_held(killed)
    assert not left, left
    assert not wedged, (wedged, pool.logs())
    assert not broken, broken[:10]
    # The chaos happened: every kind of fault, and calls that needed their retries.
    assert set(faults) == {*KINDS, "refused"}, faults
    assert max(calls.values()) > 1
    # Streams dropped after their text went out were retried, their text retracted first
    # (a drop the model call's worker did not live through is retried by a run instead).
    assert server.text_drops < 2 or retracted > 0, (server.text_drops, retracted)

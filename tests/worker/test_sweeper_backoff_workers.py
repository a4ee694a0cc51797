"""The sweeper's backoff with a real worker process: many conversations wait behind one
slot (their kicks in the broker or in the worker's own line, with no lease) while the
sweeper passes every 0.2 s. Each waiting head is kicked by the sweeper a number of times
that grows with the log of its wait, not once per pass, and every turn still ends, in
order."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from convoq.redis.keys import KeySchema
from tests.support.telemetry import scrape, value
from tests.support.workers import WorkerPool

# The process's own line, with no lease, is where most of these conversations wait.
pytestmark = pytest.mark.fast_paths

AGENTS = "tests.support.fair_agents"  # "slow": 0.3 s per turn
INTERVAL_S = 0.2
CONVERSATIONS = 16
TURNS = 2


@pytest.fixture
def busy_slot(redis_url: str, tmp_path: Path) -> Iterator[WorkerPool]:
    pool = WorkerPool(
        redis_url,
        tmp_path,
        concurrency=1,
        partitions=2,
        agents=AGENTS,
        sweep_interval_s=INTERVAL_S,
        metrics_port=0,
        metrics_host="127.0.0.1",
    )
    pool.start()
    yield pool
    pool.stop_all()


def head_waits_ms(r: redis.Redis, keys: KeySchema, cid: str, tids: list[str]) -> list[int]:
    """How long each turn was its conversation's head before it started: from its
    submit, or from the end of the turn before it, whichever came later."""
    waits, free_ms = [], 0
    for tid in tids:
        created, started, finished = (
            int(v) for v in r.hmget(keys.turn(cid, tid), "created_ms", "started_ms", "finished_ms")
        )
        waits.append(max(0, started - max(created, free_ms)))
        free_ms = finished
    return waits


def test_waiting_heads_get_log_many_kicks_not_one_per_pass(
    busy_slot: WorkerPool, redis_client: redis.Redis
) -> None:
    cids = [f"wait{n}" for n in range(CONVERSATIONS)]
    with busy_slot.client() as client:
        (info,) = client.workers().values()
        port = int(info["metrics_port"])
        before = scrape(port)
        handles = {cid: [client.submit(cid, f"{cid} {n}", agent="slow") for n in range(TURNS)]
                   for cid in cids}  # fmt: skip
        for group in handles.values():
            for handle in group:
                assert handle.wait(120).ok  # type: ignore[attr-defined]
        after = scrape(port)
        for cid in cids:
            stored = [m.text for m in client.history(cid)]
            assert stored == [text for n in range(TURNS) for text in (f"{cid} {n}",
                              f"done {cid} {n}")]  # fmt: skip

    keys, interval_ms = KeySchema(busy_slot.prefix), INTERVAL_S * 1000
    waits = [
        wait
        for cid, group in handles.items()
        for wait in head_waits_ms(redis_client, keys, cid, [h.turn_id for h in group])
    ]
    kicks = value(after, "convoq_sweeper_kicks_total") - value(before, "convoq_sweeper_kicks_total")
    held = value(after, "convoq_sweeper_kicks_held_total") - value(
        before, "convoq_sweeper_kicks_held_total"
    )
    # The k-th kick of one head comes (2**(k-1) - 1) intervals after its first at the
    # earliest (holds of 1, 2, 4, ... intervals), and only while the head waits.
    bound = sum(1 + int(math.log2(wait / interval_ms + 1)) for wait in waits)
    per_pass = sum(int(wait / interval_ms) for wait in waits)  # one kick per pass, at most
    print(f"sweeper kicks {kicks:.0f}, held {held:.0f}, bound {bound}, waits/interval {per_pass}")
    assert kicks <= bound
    assert held > 0  # heads waited through passes that held their kicks back

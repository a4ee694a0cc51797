"""A worker whose link to Redis goes down for longer than the lease at every run of a
turn, more often than ``CONVOQ_MAX_ATTEMPTS``, then holds: the turn succeeds. Each run's
worker lived, so it reports the run cut off once Redis answers again, and only runs whose
worker never comes back count as crashed. The link is a loopback proxy between the worker
and redis-server (its broker connects directly), cut while the turn's tool runs, held
down for the lease plus 1.5 s, then restored; the tool plays a payment API that dedupes on
the idempotency key: one effect, however often the call ran."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from convoq import Client
from convoq.redis import KeySchema
from tests.support.redis_proxy import LossyProxy
from tests.support.redis_server import RedisServer
from tests.support.rerun_agents import rerun_key
from tests.support.workers import WorkerPool, wait_until

pytestmark = pytest.mark.slow

LEASE_MS = 1500
MAX_ATTEMPTS = 2
CUTS = 2 * MAX_ATTEMPTS  # more cut-off runs than the crash budget


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[LossyProxy]:
    link = LossyProxy(redis_server.port)
    yield link
    link.close()


@pytest.mark.parametrize("drop", [False, True], ids=["partition", "reset"])
def test_a_link_cut_at_every_run_does_not_fail_the_turn(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    redis_server: RedisServer,
    proxy: LossyProxy,
    r: redis.Redis,
    drop: bool,
) -> None:
    monkeypatch.setenv("RERUN_TEST_REDIS_URL", redis_server.url)  # the workers inherit it
    pool = WorkerPool(
        proxy.url,
        tmp_path,
        agents="tests.support.rerun_agents",
        broker_url=redis_server.url,
        lease_ms=LEASE_MS,
        sweep_interval_s=0.5,
        max_attempts=MAX_ATTEMPTS,
    )
    cid = f"cut-{uuid.uuid4().hex[:8]}"
    executions = rerun_key(pool.prefix, "executions", cid)
    gate = rerun_key(pool.prefix, "gate", cid)
    r.set(gate, 0)
    try:
        pool.start(1)
        with Client(
            redis_server.url, broker_url=redis_server.url, prefix=pool.prefix, partitions=4
        ) as client:
            handle = client.submit(cid, "pay 5", agent="charger")
            turn = KeySchema(pool.prefix).turn(cid, handle.turn_id)
            for run in range(1, CUTS + 2):
                wait_until(lambda n=run: r.llen(executions) >= n, 60, what=f"run {run} of the tool")
                if run <= CUTS:
                    proxy.cut(drop=drop)
                    r.set(gate, run)  # the tool returns into a link that is down
                    time.sleep(LEASE_MS / 1000 + 1.5)
                    proxy.restore()
                    # Its worker reports the run cut off once Redis answers again.
                    wait_until(
                        lambda n=run: int(r.hget(turn, "cut_offs") or 0) >= n,
                        60,
                        what=f"the report of run {run}",
                    )
                r.set(gate, run)
            result = handle.wait(60, raise_on_error=False)
            events = list(handle.events(timeout=10))
    finally:
        pool.stop_all()
    assert result.status == "succeeded", (result.error, pool.logs())
    assert result.text == "charged: pay 5"
    assert result.attempts == CUTS + 1
    ran = r.lrange(executions, 0, -1)
    assert len(ran) == CUTS + 1 and len(set(ran)) == 1  # one idempotency key
    assert r.smembers(rerun_key(pool.prefix, "effects", cid)) == set(ran)  # one effect
    runs, cut_offs = (int(v) for v in r.hmget(turn, ["runs", "cut_offs"]))
    assert (runs, cut_offs) == (1, CUTS)  # only the last run counts against the budget
    reasons = [e.data["reason"] for e in events if e.type == "resumed"]
    # Each takeover says worker_cut_off when the report landed before the next run began,
    # worker_lost when that run was first (the sweeper's kick and the worker's report race;
    # which one wins does not change the counts above). tests/redis/test_cut_offs.py
    # checks the reason of a report that lands first.
    assert len(reasons) == CUTS and set(reasons) <= {"worker_cut_off", "worker_lost"}

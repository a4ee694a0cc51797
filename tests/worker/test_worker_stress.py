"""No turn stays running: many short turns on short leases across two worker processes all
end; a warm shutdown (SIGTERM) of a worker whose turn is stuck in a model call ends with a
bound and hands the turn back. Real worker processes and redis-server."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import redis

from convoq.messages import MessageRole
from tests.support.redis_server import RedisServer
from tests.support.workers import running_pool, wait_until

pytestmark = pytest.mark.slow

CONVERSATIONS, ROUNDS = 16, 4


def test_many_short_turns_on_short_leases_all_end(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Each round: one turn for each of 16 conversations at once, a blocking model call of
    1 s, leases of 3 s (renewed every second) on 2 x 4 slots: renewals, ends of runs and
    new leases keep crossing. Every turn must end; each round is given a minute, far
    more than it needs, so only a stuck turn fails it. (Before the renewer stopped on the
    run's end, a turn stayed running for good within a few rounds.)"""
    started = time.monotonic()
    with running_pool(
        redis_server.url, tmp_path, 2, agents="tests.support.chaos_agents",
        lease_ms=3000, concurrency=4, sweep_interval_s=0.5,
    ) as pool, pool.client() as client:  # fmt: skip
        cids = [f"stress-{uuid.uuid4().hex[:6]}-{c}" for c in range(CONVERSATIONS)]
        for n in range(ROUNDS):
            handles = [client.submit(cid, f"r{n}", agent="napper") for cid in cids]
            deadline = time.monotonic() + 60
            results = [h.wait(max(1.0, deadline - time.monotonic())) for h in handles]
            assert [x.status for x in results] == ["succeeded"] * CONVERSATIONS, n
        for cid in cids:
            users = [m.text for m in client.history(cid) if m.role == MessageRole.USER]
            assert users == [f"r{n}" for n in range(ROUNDS)], cid
    print(
        f"\nstress: {CONVERSATIONS * ROUNDS} turns ({ROUNDS} rounds x {CONVERSATIONS}"
        f" conversations, 1 s model calls), 2 workers x 4 slots, lease 3 s: all ended,"
        f" none stuck; {time.monotonic() - started:.1f}s with start-up"
    )


def test_cancel_and_warm_shutdown_stop_turns_stuck_in_a_model_call(
    redis_server: RedisServer, tmp_path: Path, r: redis.Redis
) -> None:
    """A turn whose model call never returns is cancelled (the renewal reports the
    cancel; checkpoints alone would never see it), and the conversation's next turn runs.
    Then SIGTERM while another turn blocks in its model call: the worker stops within its
    bound (grace 1 s, then the turn is handed back) instead of waiting for the call; a
    new worker then runs the turn to its end."""
    with running_pool(
        redis_server.url, tmp_path, 1, lease_ms=2000, sweep_interval_s=0.5,
        shutdown_grace_s=1,
    ) as pool, pool.client() as client:  # fmt: skip
        [leaving] = pool.workers
        stuck_cid, stuck_word = f"stuck-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:8]
        stuck = client.submit(stuck_cid, f"{stuck_word} never returns", agent="blocker")
        after = client.submit(stuck_cid, "after", agent="echo")
        wait_until(lambda: r.llen(f"{pool.prefix}:test:ran:{stuck_word}") == 1, 30)
        assert client.cancel(stuck) == "stopping"
        assert stuck.wait(30, raise_on_error=False).status == "cancelled"
        assert after.wait(30).text == "seen: after"
        cid, word = f"warm-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:8]
        ran = f"{pool.prefix}:test:ran:{word}"
        turn = client.submit(cid, f"{word} stuck", agent="blocker")
        wait_until(lambda: r.llen(ran) == 1, 30, what="the model call")
        assert leaving.process is not None
        leaving.process.send_signal(signal.SIGTERM)
        try:
            leaving.process.wait(45)  # the blocked call alone would hold it for 90 s
        except subprocess.TimeoutExpired:
            pytest.fail(f"warm shutdown did not end:\n{leaving.log_tail()}")
        assert turn.status() == "running"  # handed back unfinished, not failed
        r.set(f"{pool.prefix}:test:release:{word}", 1)
        pool.start(1)
        assert turn.wait(60).text == f"released {word} stuck"
        assert r.llen(ran) == 2
        assert "handed back" in leaving.log_tail(200)

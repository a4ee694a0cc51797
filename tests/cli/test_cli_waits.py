"""``convoq complete-call`` and ``convoq signal`` against real workers: each answers a
waiting turn, which resumes; mistakes are one line, never a traceback."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from convoq.client import Client
from tests.support.workers import WorkerPool, module_pool, wait_until

pool = module_pool(1, agents="tests.support.world_agents")


def _parked(pool: WorkerPool, text: str) -> tuple[Client, str, str, str]:
    order = f"o{uuid.uuid4().hex[:8]}"
    cid = f"cli-{order}"
    client = pool.client()
    handle = client.submit(cid, f"{text} {order}", agent="courier")
    wait_until(lambda: handle.status() == "waiting", 60, what="the turn parks")
    return client, cid, handle.turn_id, order


def test_complete_call_supplies_the_result(pool: WorkerPool, run: Callable[..., str]) -> None:
    client, cid, tid, order = _parked(pool, "ship")
    with client:
        refused = run("complete-call", cid, tid, f"ship-{order}", "{not json", code=1)
        assert "RESULT must be JSON" in refused and "Traceback" not in refused
        both = run("complete-call", cid, tid, f"ship-{order}", "1", "--error", "x", code=1)
        assert "either a result or an error" in both and "Traceback" not in both
        wrong = run("approve", cid, tid, f"ship-{order}", code=1)
        assert "waits for its result" in wrong and "Traceback" not in wrong
        out = run("complete-call", cid, tid, f"ship-{order}", '{"tracking": "C1"}')
        assert "recorded: the turn resumes" in out
        assert client.handle(cid, tid).wait(60).text == 'done: {"tracking":"C1"}'


def test_signal_wakes_the_waiting_turn(pool: WorkerPool, run: Callable[..., str]) -> None:
    client, cid, tid, _ = _parked(pool, "pay")
    with client:
        assert "signal name" in run("signal", cid, "", code=1)
        out = run("signal", cid, "paid", '"yes"', "--id", "evt-9")
        assert "delivered to await_payment-" in out and tid in out
        assert "nothing changed" in run("signal", cid, "paid", '"yes"', "--id", "evt-9")
        assert client.handle(cid, tid).wait(60).text == "done: yes"
        assert "kept for the next wait (1 kept)" in run("signal", cid, "paid")

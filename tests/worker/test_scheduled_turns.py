"""Scheduled turns on real worker processes: a turn submitted with ``delay_s`` or
``not_before`` waits as ``scheduled`` and runs once it is due (never before, by Redis's
clock), behind the turns queued before it fired and ahead of those after; it is listed,
cancelled, deduplicated by its idempotency key; a tool's ``ctx.schedule`` rerun after its
worker was killed schedules once."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis

from convoq import Client
from convoq.client import TurnResult
from convoq.errors import (
    ConversationBusyError,
    IdempotencyKeyReusedError,
    InvalidScheduleError,
    TurnCancelledError,
)
from convoq.redis.keys import KeySchema
from tests.support.workers import WorkerPool, module_pool, wait_until

pytestmark = pytest.mark.slow

pool = module_pool(
    2, agents="tests.support.schedule_agents", lease_ms=2000, sweep_interval_s=0.5,
    timer_interval_s=0.2,
)  # fmt: skip


def _cid() -> str:
    return f"sched-{uuid.uuid4().hex[:8]}"


def _ran(r: redis.Redis, pool: WorkerPool, cid: str) -> list[tuple[str, int]]:
    """The turns ``stamp`` ran in ``cid``: (message, Redis ms when it ran)."""
    found = []
    for raw in r.lrange(f"{pool.prefix}:test:ran:{cid}", 0, -1):
        said, _, ms = raw.decode().rpartition("@")
        found.append((said, int(ms)))
    return found


def test_a_delayed_turn_waits_as_scheduled_then_runs_once_due(
    client: Client, r: redis.Redis, pool: WorkerPool
) -> None:
    cid = _cid()
    handle = client.submit(cid, f"{cid}|later", agent="stamp", delay_s=1.5)
    record = handle.record()
    assert record.status == "scheduled" and record.due_ms is not None
    assert [s.turn_id for s in client.scheduled(cid)] == [handle.turn_id]
    assert handle.wait(5).status == "scheduled"  # settled: it rests until its time
    assert handle.wait(30, until="final").text == f"ran {cid}|later"
    done = handle.record()
    assert done.fired_ms is not None and done.fired_ms >= record.due_ms
    # Polled every 0.2 s here: queued within a poll (and a loaded machine's delays).
    assert done.fired_ms - record.due_ms < 5_000
    assert done.started_ms is not None and done.started_ms >= record.due_ms
    [(_, ran_ms)] = _ran(r, pool, cid)
    assert ran_ms >= record.due_ms
    assert client.scheduled(cid) == []
    statuses = [e.data.get("status") for e in handle.events() if e.type == "status"]
    assert statuses[:3] == ["scheduled", "queued", "running"]


def test_on_done_is_called_once_the_scheduled_turn_ran(client: Client) -> None:
    cid = _cid()
    done = threading.Event()
    seen: list[str] = []

    def on_done(result: TurnResult) -> None:
        seen.append(result.status)
        done.set()

    client.submit(cid, f"{cid}|callback", agent="stamp", delay_s=0.5, on_done=on_done)
    assert done.wait(30) and seen == ["succeeded"]


def test_with_both_the_later_time_wins(client: Client) -> None:
    soon = datetime.now(UTC) + timedelta(seconds=5)
    later = client.submit(_cid(), "x", agent="stamp", not_before=soon, delay_s=600).record()
    assert later.due_ms is not None and later.due_ms >= later.created_ms + 600_000
    far = datetime.now(UTC) + timedelta(days=3)
    record = client.submit(_cid(), "x", agent="stamp", not_before=far, delay_s=5).record()
    assert record.due_ms == int(far.timestamp() * 1000) + (far.microsecond % 1000 > 0)
    for r in (later, record):
        assert client.cancel(client.handle(r.conversation_id, r.turn_id)) == "cancelled"


def test_a_time_already_past_is_due_at_once(client: Client) -> None:
    handle = client.submit(_cid(), "x", agent="stamp", not_before=datetime(1900, 1, 1, tzinfo=UTC))
    assert handle.record().due_ms == 0
    assert handle.wait(30, until="final").status == "succeeded"


def test_a_timer_whose_index_entry_was_lost_still_fires_after_a_sweep(
    client: Client, r: redis.Redis, pool: WorkerPool
) -> None:
    cid = _cid()
    handle = client.submit(cid, f"{cid}|lost", agent="stamp", delay_s=0.5)
    # As if the client died between its two writes: the timer is there, its entry is not.
    r.zrem(KeySchema(pool.prefix).timer_index(), cid)
    assert handle.wait(30, until="final").status == "succeeded"  # the sweep repaired it


def test_not_before_is_an_instant(client: Client, r: redis.Redis, pool: WorkerPool) -> None:
    cid = _cid()
    at = datetime.now(UTC) + timedelta(seconds=1)
    handle = client.submit(cid, f"{cid}|at", agent="stamp", not_before=at)
    assert handle.record().due_ms == int(at.timestamp() * 1000) + (at.microsecond % 1000 > 0)
    assert handle.wait(30, until="final").status == "succeeded"


def test_a_scheduled_turn_runs_after_turns_queued_before_it_fired_and_before_later_ones(
    client: Client, r: redis.Redis, pool: WorkerPool
) -> None:
    cid = _cid()
    scheduled = client.submit(cid, f"{cid}|scheduled", agent="stamp", delay_s=1.0)
    before = client.submit(cid, f"{cid}|before", agent="stamp")
    assert before.wait(30).status == "succeeded"
    wait_until(lambda: scheduled.status() != "scheduled", 30, what="the timer to fire")
    after = client.submit(cid, f"{cid}|after", agent="stamp")
    assert after.wait(30).status == "succeeded"
    assert scheduled.wait(30, until="final").status == "succeeded"
    order = [said.split("|")[1] for said, _ in _ran(r, pool, cid)]
    assert order == ["before", "scheduled", "after"]
    stored = [m.text for m in client.history(cid) if m.role == "user"]
    assert [s.split("|")[1] for s in stored] == ["before", "scheduled", "after"]


def test_a_cancelled_scheduled_turn_never_runs(
    client: Client, r: redis.Redis, pool: WorkerPool
) -> None:
    cid = _cid()
    handle = client.submit(cid, f"{cid}|never", agent="stamp", delay_s=0.5)
    assert client.cancel(handle) == "cancelled"
    assert client.scheduled(cid) == []
    with pytest.raises(TurnCancelledError):
        handle.wait(10, until="final")
    # A turn submitted well after the due time runs; the cancelled one never did.
    later = client.submit(cid, f"{cid}|later", agent="stamp", delay_s=1.0)
    assert later.wait(30, until="final").status == "succeeded"
    assert [said for said, _ in _ran(r, pool, cid)] == [f"{cid}|later"]
    assert handle.status() == "cancelled"


def test_if_busy_reject_refuses_to_schedule_while_the_conversation_is_busy(
    client: Client, r: redis.Redis, pool: WorkerPool
) -> None:
    cid = _cid()
    idle = client.submit(cid, "y", agent="stamp", delay_s=600, if_busy="reject")
    assert idle.status() == "scheduled"  # a scheduled turn is in no line: still idle
    lease = KeySchema(pool.prefix).lease(cid)
    r.hset(lease, "holder", "an in-process turn")  # as an Agent on Redis memory holds it
    r.pexpire(lease, 60_000)
    try:
        with pytest.raises(ConversationBusyError):
            client.submit(cid, "z", agent="stamp", delay_s=600, if_busy="reject")
    finally:
        r.delete(lease)
    assert [s.turn_id for s in client.scheduled(cid)] == [idle.turn_id]
    assert client.cancel(idle) == "cancelled"


def test_the_idempotency_key_of_a_scheduled_turn(client: Client) -> None:
    cid = _cid()
    first = client.submit(cid, "x", agent="stamp", delay_s=60, idempotency_key="k")
    again = client.submit(cid, "x", agent="stamp", delay_s=60, idempotency_key="k")
    assert again.turn_id == first.turn_id and again.repeated
    with pytest.raises(IdempotencyKeyReusedError) as caught:
        client.submit(cid, "x", agent="stamp", delay_s=30, idempotency_key="k")
    assert caught.value.details["mismatch"] == ["schedule"]
    assert [s.turn_id for s in client.scheduled(cid)] == [first.turn_id]
    assert client.cancel(first) == "cancelled"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"not_before": datetime(2030, 1, 1)}, "not_before"),
        ({"delay_s": -1}, "delay_s"),
        ({"delay_s": float("nan")}, "delay_s"),
        ({"delay_s": True}, "delay_s"),
        ({"delay_s": 366 * 86_400 + 1}, "delay_s"),
    ],
)
def test_bad_schedules_are_refused_with_nothing_stored(
    client: Client, kwargs: dict[str, object], field: str
) -> None:
    cid = _cid()
    with pytest.raises(InvalidScheduleError) as caught:
        client.submit(cid, "x", agent="stamp", **kwargs)  # type: ignore[arg-type]
    assert caught.value.details["field"] == field
    assert client.scheduled(cid) == []


@pytest.mark.parametrize("if_busy", ["interrupt", "rollback", "merge"])
def test_a_double_texting_mode_cannot_be_scheduled(client: Client, if_busy: str) -> None:
    cid = _cid()
    with pytest.raises(InvalidScheduleError, match=f"if_busy='{if_busy}' cannot be scheduled"):
        client.submit(cid, "x", agent="stamp", delay_s=5, if_busy=if_busy)
    assert client.scheduled(cid) == []


def test_ctx_schedule_rerun_after_its_worker_was_killed_schedules_once(
    client: Client, r: redis.Redis, pool: WorkerPool
) -> None:
    cid = _cid()
    handle = client.submit(cid, "remind me", agent="follow_up", metadata={"kill": True})
    try:
        result = handle.wait(60)
    finally:
        dead = [w for w in pool.workers if not w.alive()]
        for worker in dead:
            pool.workers.remove(worker)
        pool.start(len(dead))
    assert len(dead) == 1  # the first run killed its worker
    scheduled = [t.decode() for t in r.lrange(f"{pool.prefix}:test:scheduled:{cid}", 0, -1)]
    assert len(scheduled) == 2 and scheduled[0] == scheduled[1]  # rerun: the same turn
    assert result.text == f"scheduled {scheduled[0]}"
    reminder = client.handle(cid, scheduled[0])
    assert reminder.wait(30, until="final").text == "ran reminder"
    assert [said for said, _ in _ran(r, pool, "reminder")] == ["reminder"]


def test_a_sync_tool_on_a_worker_schedules_a_follow_up(
    client: Client, r: redis.Redis, pool: WorkerPool
) -> None:
    cid = _cid()
    result = client.submit(cid, "remind me", agent="follow_up_sync").wait(60)
    reminder_id = result.text.removeprefix("scheduled ")
    reminder = client.handle(cid, reminder_id).wait(30, until="final")
    assert reminder.text == "ran sync reminder"

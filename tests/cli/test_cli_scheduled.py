"""``convoq submit --delay / --at``, ``convoq scheduled`` and ``convoq cancel`` of a
scheduled turn, against a real Redis and one real worker process; a bad time is one
usage line (exit 2) before anything is connected to."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from convoq.cli._scheduled import parse_at, parse_delay
from convoq.errors import InvalidScheduleError
from tests.support.workers import module_pool, wait_until

pytestmark = pytest.mark.slow

pool = module_pool(1, agents="tests.support.schedule_agents", timer_interval_s=0.2)


def _cid() -> str:
    return f"cli-sched-{uuid.uuid4().hex[:8]}"


def test_a_delayed_turn_is_listed_then_cancelled(run: Callable[..., str]) -> None:
    cid = _cid()
    out = run("submit", cid, "later", "--agent", "echo", "--delay", "10m")
    tid = out.splitlines()[0]
    assert f"turn {tid} scheduled for {cid}" in out
    listed = run("scheduled", cid)
    assert tid in listed and "echo" in listed and "later" in listed
    assert f"turn {tid}: cancelled" in run("cancel", cid, tid)
    assert f"no scheduled turn waits in {cid}" in run("scheduled", cid)


def test_at_runs_the_turn_once_due(run: Callable[..., str]) -> None:
    cid = _cid()
    at = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    out = run("submit", cid, "soon", "--agent", "echo", "--at", at, "--wait", "--timeout", "30")
    tid = out.splitlines()[0]
    assert "scheduled" in out  # --wait answers at once: it rests until its time
    wait_until(lambda: "ran soon" in run("status", cid, tid), 30, interval=0.2)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--delay", "soon"], "is no duration"),
        (["--delay", "-5"], "delay_s must be between 0"),
        (["--at", "tomorrow"], "is no ISO 8601 time"),
        (["--at", "2030-01-01T09:00:00"], "has no UTC offset"),
    ],
)
def test_a_bad_time_is_one_usage_line(run: Callable[..., str], args: list[str], said: str) -> None:
    cid = _cid()
    out = run("submit", cid, "x", "--agent", "echo", *args, code=2)
    assert said in out and "Traceback" not in out
    assert f"no scheduled turn waits in {cid}" in run("scheduled", cid)


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("30s", 30), ("5m", 300), ("1h30m", 5400), ("250ms", 0.25), ("2d", 172800), ("7.5", 7.5)],
)
def test_durations(raw: str, seconds: float) -> None:
    assert parse_delay(raw) == seconds


def test_at_keeps_its_offset() -> None:
    assert parse_at("2030-01-01T09:00:00+01:00") == datetime(2030, 1, 1, 8, tzinfo=UTC)
    assert parse_at("2030-01-01T08:00:00Z") == datetime(2030, 1, 1, 8, tzinfo=UTC)
    with pytest.raises(InvalidScheduleError):
        parse_at("2030-01-01")

"""Scheduled turns through the HTTP gateway (a real uvicorn process over a real worker):
``delay_s`` / ``not_before`` in a submit body, the scheduled list of a conversation (with
the API key's conversation prefix enforced), cancel, and bad times refused as
problem+json with nothing stored."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import redis

from tests.support.gateway import GatewayProcess, module_gateway, turns_path
from tests.support.workers import WorkerPool, module_pool

pytestmark = pytest.mark.slow

pool = module_pool(1, agents="tests.support.schedule_agents", timer_interval_s=0.2)
gateway = module_gateway()


def _cid(label: str = "sched") -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


def _scheduled(http: httpx.Client, cid: str) -> list[dict[str, Any]]:
    response = http.get(f"/v1/conversations/{cid}/scheduled")
    assert response.status_code == 200, response.text
    turns: list[dict[str, Any]] = response.json()["turns"]
    return turns


def test_a_delayed_turn_is_listed_until_cancelled(gateway: GatewayProcess) -> None:
    cid = _cid()
    with gateway.client("submitter") as http:
        submitted = http.post(
            turns_path(cid), json={"message": "later", "agent": "echo", "delay_s": 600}
        )
        assert submitted.status_code == 202, submitted.text
        assert submitted.json()["status"] == "scheduled"
        tid = submitted.json()["turn_id"]
        view = http.get(f"{turns_path(cid)}/{tid}").json()
        assert view["status"] == "scheduled" and view["due_ms"] >= view["created_ms"] + 600_000
        [listed] = _scheduled(http, cid)
        assert (listed["turn_id"], listed["input_text"], listed["due_ms"]) == (
            tid, "later", view["due_ms"],
        )  # fmt: skip
        cancelled = http.post(f"{turns_path(cid)}/{tid}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert http.get(f"{turns_path(cid)}/{tid}").json()["status"] == "cancelled"
        assert _scheduled(http, cid) == []


def test_not_before_runs_the_turn_once_due(gateway: GatewayProcess) -> None:
    cid = _cid()
    at = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    with gateway.client("submitter") as http:
        submitted = http.post(
            turns_path(cid), json={"message": "soon", "agent": "echo", "not_before": at}
        )
        assert submitted.status_code == 202, submitted.text
        tid = submitted.json()["turn_id"]
        done = http.get(f"{turns_path(cid)}/{tid}", params={"wait": 30, "until": "final"})
        body = done.json()
        assert body["status"] == "succeeded" and body["text"] == "ran soon"
        assert body["fired_ms"] >= body["due_ms"] and body["started_ms"] >= body["due_ms"]


def test_a_multipart_submit_takes_delay_s(gateway: GatewayProcess) -> None:
    cid = _cid()
    with gateway.client("submitter") as http:
        files = {"files": ("a.txt", b"x", "text/plain")}
        data = {"agent": "echo", "text": "form", "delay_s": "600"}
        submitted = http.post(turns_path(cid), data=data, files=files)
        assert submitted.status_code == 202, submitted.text
        assert [t["input_text"] for t in _scheduled(http, cid)] == ["form"]


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({"not_before": "2030-01-01T00:00:00"}, "ValidationError"),  # no UTC offset
        ({"delay_s": -1}, "ValidationError"),
        ({"not_before": "tomorrow"}, "ValidationError"),
        # Double texting acts on the turn in progress when a message arrives: not on one
        # that arrives when it is due.
        ({"delay_s": 5, "if_busy": "merge"}, "InvalidScheduleError"),
        ({"delay_s": 5, "if_busy": "interrupt"}, "InvalidScheduleError"),
        ({"delay_s": 5, "if_busy": "rollback"}, "InvalidScheduleError"),
    ],
)
def test_a_bad_time_is_422_and_nothing_is_stored(
    gateway: GatewayProcess, pool: WorkerPool, r: redis.Redis, extra: dict[str, Any], error: str
) -> None:
    cid = _cid()
    with gateway.client("submitter") as http:
        response = http.post(turns_path(cid), json={"message": "x", "agent": "echo", **extra})
        assert response.status_code == 422, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.json()["title"] == error
        assert _scheduled(http, cid) == []
    assert r.keys(f"{pool.prefix}:{{{cid}}}:*") == []


def test_a_key_reads_only_its_own_prefix(gateway: GatewayProcess) -> None:
    with gateway.client("tenant") as http:
        assert http.get(f"/v1/conversations/{_cid('tenant-a:x')}/scheduled").status_code == 200
        assert http.get(f"/v1/conversations/{_cid('tenant-b:x')}/scheduled").status_code == 403


def test_a_scheduled_turn_is_settled_for_long_polls_and_streams(gateway: GatewayProcess) -> None:
    cid = _cid()
    with gateway.client("submitter") as http:
        submitted = http.post(
            turns_path(cid), json={"message": "later", "agent": "echo", "delay_s": 600}
        )
        tid = submitted.json()["turn_id"]
        started = time.monotonic()
        view = http.get(f"{turns_path(cid)}/{tid}", params={"wait": 30, "until": "settled"})
        assert view.json()["status"] == "scheduled"
        stream = http.get(f"{turns_path(cid)}/{tid}/events", params={"until": "settled"})
        assert time.monotonic() - started < 20  # both answered at once, not after their wait
        events = [line for line in stream.text.splitlines() if line.startswith("data: ")]
        assert events and '"status":"scheduled"' in events[-1]
        assert http.post(f"{turns_path(cid)}/{tid}/cancel").status_code == 200

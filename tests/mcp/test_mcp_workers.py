"""MCP tools run by real Celery workers: sessions opened by the worker process and kept;
health in the worker entry; an approval parks and resumes on another worker; a worker
killed -9 mid-call reruns the call with the same idempotency key in its _meta; no server
process outlives a worker, stopped or killed."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from convoq import Client
from convoq.messages import ImagePart, MessageRole
from tests.support.gateway import running_gateway
from tests.support.mcp_agents import asked_path, log_path
from tests.support.mcp_server import PIXEL
from tests.support.mcp_servers import HTTPServerProcess, pid_alive, seen
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool, running_pool, wait_until

pytestmark = pytest.mark.slow

HTTP_TOKEN = "worker-token"


@pytest.fixture(scope="module")
def http_mcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HTTPServerProcess]:
    """The test server over HTTP; workers started after it find it in their environment."""
    process = HTTPServerProcess(tmp_path_factory.mktemp("mcp-http") / "calls.log").start()
    os.environ["MCP_TEST_HTTP_URL"], os.environ["MCP_TEST_TOKEN"] = process.url, HTTP_TOKEN
    try:
        yield process
    finally:
        del os.environ["MCP_TEST_HTTP_URL"], os.environ["MCP_TEST_TOKEN"]
        process.stop()


@pytest.fixture(scope="module")
def pool(
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
    http_mcp: HTTPServerProcess,
) -> Iterator[WorkerPool]:
    settings = {"lease_ms": 2000, "sweep_interval_s": 0.5, "concurrency": 4}
    logs = tmp_path_factory.mktemp("workers")
    with running_pool(
        redis_server.url, logs, 2, agents="tests.support.mcp_agents", **settings
    ) as p:
        yield p


@pytest.fixture(scope="module")
def client(pool: WorkerPool) -> Iterator[Client]:
    with pool.client() as c:
        yield c
    log_path(pool.prefix).unlink(missing_ok=True)
    asked_path(pool.prefix).unlink(missing_ok=True)


def _cid() -> str:
    return f"mcp-{uuid.uuid4().hex[:8]}"


def _children(pid: int) -> set[int]:
    """The live child processes of ``pid``."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.update(int(c) for c in text)
    return {c for c in found if pid_alive(c)}


def _replace(pool: WorkerPool, worker_pid: int) -> None:
    worker = next(w for w in pool.workers if w.pid == worker_pid)
    pool.workers.remove(worker)
    pool.start(1)


def test_a_worker_keeps_its_session_and_reports_the_server_healthy(
    client: Client, pool: WorkerPool
) -> None:
    log = log_path(pool.prefix)
    before = len(seen(log))
    for _ in range(7):
        assert client.submit(_cid(), "add 2 3", agent="mcp").wait(30).text == "tool said: 5"
    worker_pid = int(asked_path(pool.prefix).read_text().split()[-1])
    # Seven calls, one server process per worker at most: sessions are kept.
    assert len({c["pid"] for c in seen(log)[before:]}) <= len(pool.workers)

    def healthy() -> bool:
        entry = next(w for w in client.workers().values() if w["pid"] == worker_pid)
        return entry.get("mcp", {}).get("t", {}).get("state") == "connected"

    wait_until(healthy, 30, what="the worker entry to show the MCP server connected")
    entry = next(w for w in client.workers().values() if w["pid"] == worker_pid)
    assert entry["mcp"]["t"]["tools"] >= 5 and entry["mcp"]["time"]["state"] in (
        "connected",
        "not started",
    )


def test_an_unreachable_server_fails_the_call_and_shows_in_the_worker_entry(
    client: Client, pool: WorkerPool
) -> None:
    result = client.submit(_cid(), "gone", agent="mcp").wait(30)
    assert "MCP server 'gone' cannot be reached" in result.text  # the turn went on
    worker_pid = int(asked_path(pool.prefix).read_text().split()[-1])

    def shown() -> dict[str, object] | None:
        entry = next(w for w in client.workers().values() if w["pid"] == worker_pid)
        gone = entry.get("mcp", {}).get("gone")
        return gone if gone and gone["state"] == "unreachable" else None

    gone = wait_until(shown, 30, what="the worker entry to show the server unreachable")
    assert "no-such-mcp-server" in str(gone["error"])


def test_the_console_s_workers_route_shows_each_worker_s_mcp_servers(
    client: Client, pool: WorkerPool, tmp_path: Path
) -> None:
    result = client.submit(_cid(), "gone", agent="mcp").wait(30)  # 'gone' now unreachable
    assert "cannot be reached" in result.text
    worker_pid = int(asked_path(pool.prefix).read_text().split()[-1])
    with running_gateway(pool, tmp_path) as gateway, gateway.client("reader") as http:

        def reported() -> dict[str, Any] | None:
            listed = http.get("/v1/workers").json()["workers"]
            worker = next(w for w in listed if w["pid"] == worker_pid)
            servers = {m["name"]: m for m in worker["mcp"]}
            gone = servers.get("gone")
            return servers if gone and gone["state"] == "unreachable" else None

        servers = wait_until(reported, 30, what="the workers route to show 'gone' unreachable")
    assert "no-such-mcp-server" in str(servers["gone"]["error"])
    assert set(servers) >= {"gone", "t", "time"}
    assert all(m["state"] in ("connected", "unreachable", "not started") for m in servers.values())


def test_a_worker_calls_an_http_server_with_the_token_from_its_environment(
    client: Client, http_mcp: HTTPServerProcess
) -> None:
    assert client.submit(_cid(), "hadd 20 22", agent="mcp").wait(30).text == "tool said: 42"
    [call] = [c for c in seen(http_mcp.log) if c["tool"] == "add"]
    assert call["authorization"] == f"Bearer {HTTP_TOKEN}"
    assert call["meta"]["idempotency_key"].startswith("convoq-")


def test_an_image_from_a_worker_is_stored_with_the_tool_result(client: Client) -> None:
    cid = _cid()
    client.submit(cid, "pixel", agent="mcp").wait(30)
    tool_message = next(m for m in client.history(cid) if m.role == MessageRole.TOOL)
    [image] = tool_message.attachments
    assert isinstance(image, ImagePart) and image.data == PIXEL


def test_an_mcp_call_needing_approval_parks_and_resumes_on_another_worker(
    client: Client, pool: WorkerPool
) -> None:
    handle = client.submit(_cid(), "convert 12:00 Asia/Tokyo", agent="mcp")
    parked = handle.wait(30)
    assert parked.status == "awaiting_approval"
    [call] = parked.pending_approvals
    assert call.name == "time__convert_time"
    parker_pid = int(asked_path(pool.prefix).read_text().split()[-1])
    parker = next(w for w in pool.workers if w.pid == parker_pid)
    parker.stop()
    try:
        assert client.approve(handle, call.id, by="ops") == "resume"
        result = handle.wait(60)
    finally:
        pool.workers.remove(parker)
        pool.start(1)
    assert "Asia/Tokyo" in result.text and "21:00" in result.text
    assert result.decisions[call.id].by == "ops"


def test_a_kill_9_mid_call_reruns_it_with_the_same_idempotency_key(
    client: Client, pool: WorkerPool
) -> None:
    log = log_path(pool.prefix)
    before = len(seen(log))
    handle = client.submit(_cid(), "slow 4", agent="mcp")
    wait_until(lambda: len(seen(log)) > before, 30, what="the slow call to start")
    first = seen(log)[before]
    server_pid = first["pid"]
    worker_pid = next(w.pid for w in pool.workers if server_pid in _children(w.pid))
    victim = next(w for w in pool.workers if w.pid == worker_pid)
    orphans = _children(worker_pid)
    victim.kill()
    try:
        result = handle.wait(90)
    finally:
        pool.workers.remove(victim)
        pool.start(1)
    assert result.text == "tool said: slept 4.0"
    slow = [c for c in seen(log)[before:] if c["tool"] == "slow"]
    assert len(slow) == 2 and slow[0]["pid"] != slow[1]["pid"]
    assert slow[0]["meta"]["idempotency_key"] == slow[1]["meta"]["idempotency_key"]
    # The killed worker's servers, the busy one included, die with it.
    assert server_pid in orphans
    wait_until(
        lambda: not any(pid_alive(p) for p in orphans), 30, what="the orphaned servers to exit"
    )


def test_a_warm_stop_leaves_no_server_process(client: Client, pool: WorkerPool) -> None:
    client.submit(_cid(), "add 1 2", agent="mcp").wait(30)
    worker = next(w for w in pool.workers if _children(w.pid))
    children = _children(worker.pid)
    assert children  # the test server (and mcp-server-time once used)
    worker.stop()
    try:
        assert not worker.alive()
        assert [pid for pid in children if pid_alive(pid)] == []
    finally:
        _replace(pool, worker.pid)

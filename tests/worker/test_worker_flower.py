"""Flower, started by ``convoq flower`` on the workers' broker, lists the running worker
(started here with ``celery -A convoq.worker.app:app worker``) and a finished drain."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from convoq._ports import free_loopback_port
from tests.support.redis_server import RedisServer
from tests.support.workers import ROOT, WorkerPool, wait_until

pytestmark = pytest.mark.slow
AUTH = ("admin", "flower-test")


@pytest.fixture
def pool(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerPool]:
    # Task events are off by default; a deployment running Flower turns them on, so the
    # first task is seen too (Flower would otherwise enable them with its next broadcast).
    pool = WorkerPool(redis_server.url, tmp_path_factory.mktemp("flower"), task_events=True)
    try:
        pool.start(1, use_celery_cli=True)
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture
def flower(pool: WorkerPool) -> Iterator[str]:
    port = free_loopback_port()
    command = [sys.executable, "-m", "convoq.cli", "flower", f"--port={port}",
               f"--basic-auth={AUTH[0]}:{AUTH[1]}"]  # fmt: skip
    log = open(pool.log_dir / "flower.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        command, env=pool.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _get(base, "/healthcheck") == "OK" or process.poll() is not None, 45)
        assert process.poll() is None, (pool.log_dir / "flower.log").read_text()
        yield base
    finally:
        process.terminate()
        process.wait(15)
        log.close()


def _get(base: str, path: str) -> Any:
    try:
        response = httpx.get(base + path, auth=AUTH, timeout=5)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return response.json() if "json" in response.headers.get("content-type", "") else response.text


def test_flower_lists_the_worker_and_a_completed_drain(pool: WorkerPool, flower: str) -> None:
    assert httpx.get(flower + "/api/workers", timeout=5).status_code == 401  # auth required
    worker = pool.workers[0].name
    workers = wait_until(lambda: (_get(flower, "/api/workers?refresh=1") or {}).get(worker), 45)
    assert "convoq.drain" in str(workers.get("registered", ""))

    cid = f"flower-{uuid.uuid4().hex[:8]}"
    with pool.client() as client:
        assert client.submit(cid, "watched", agent="echo").wait(30).ok

    def finished_drain() -> list[dict[str, Any]]:
        tasks = _get(flower, "/api/tasks?taskname=convoq.drain") or {}
        return [
            t for t in tasks.values() if t.get("state") == "SUCCESS" and cid in str(t.get("args"))
        ]

    # A kick may be sent twice (a duplicate kick or the sweeper's re-kick is harmless: the
    # second drain finds the inbox empty), so every drain Flower lists is checked.
    tasks = wait_until(finished_drain, 30, what="flower to see the drain")
    for task in tasks:
        assert task["name"] == "convoq.drain" and task["worker"] == worker
        assert task["args"] == str([cid]) and task["kwargs"] == "{}"  # ids only, never bytes

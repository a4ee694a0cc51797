"""A Redis served by Sentinel on free loopback ports: a primary, its replicas and three
sentinels (Debian's ``redis-sentinel``), with short failure detection for tests. Every
process is stopped by :meth:`SentinelGroup.stop`, also after a failed start."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

import redis

from convoq._ports import free_loopback_port
from tests.support import services
from tests.support.redis_server import RedisServer
from tests.support.replicas import replicate

SERVICE = "convoq-test"
# Sentinels call the primary down after this long without an answer, and a failover that
# has not finished in the timeout is tried again.
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000


def _sentinel_id(n: int) -> str:
    """Sentinel ``n``'s run id (40 hex digits, fixed so the others can be told it)."""
    return f"{n + 1:040x}"


def sentinel_binary() -> str:
    """The redis-sentinel binary (redis-server in sentinel mode would do as well)."""
    found = shutil.which("redis-sentinel")
    if found is None:
        services.missing("no redis-sentinel binary (apt-get install -y redis-sentinel)")
    return found


class SentinelGroup:
    """``replicas`` replicas of a primary and ``sentinels`` sentinels under ``directory``;
    the sentinels want ``sentinel_password`` (as clients give it: ``sentinel_password=`` in
    the URL)."""

    def __init__(
        self,
        directory: Path,
        *,
        replicas: int = 2,
        sentinels: int = 3,
        sentinel_password: str = "sentinel-secret",
    ) -> None:
        self.directory = directory
        self.sentinel_password = sentinel_password
        self.binary = sentinel_binary()
        self.primary = RedisServer(directory / "primary")
        self.replicas = [RedisServer(directory / f"replica-{n}") for n in range(replicas)]
        self.sentinel_ports = [free_loopback_port() for _ in range(sentinels)]
        self._sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def servers(self) -> list[RedisServer]:
        return [self.primary, *self.replicas]

    def url(self, db: int = 0, query: str = "") -> str:
        """The ``redis+sentinel://`` URL convoq takes for this group (``query``: more
        options after the sentinels' password)."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        options = f"sentinel_password={self.sentinel_password}" + (f"&{query}" if query else "")
        return f"redis+sentinel://{hosts}/{SERVICE}/{db}?{options}"

    def _sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=port, password=self.sentinel_password, socket_timeout=1
        )

    def start(self, timeout_s: float = 30.0) -> None:
        try:
            for server in self.servers:
                server.start()
                # A full sync starts at once, not after diskless sync's 5 s wait for more
                # replicas (each server may become the primary).
                with redis.Redis(host="127.0.0.1", port=server.port) as client:
                    client.config_set("repl-diskless-sync-delay", 0)
            for replica in self.replicas:
                replicate(replica, self.primary.port)
            for n, port in enumerate(self.sentinel_ports):
                self._sentinels.append(self._start_sentinel(n, port))
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start_sentinel(self, n: int, port: int) -> subprocess.Popen[bytes]:
        home = self.directory / f"sentinel-{n}"
        home.mkdir(parents=True, exist_ok=True)
        config = home / "sentinel.conf"  # rewritten by the sentinel as it learns
        # The replicas and the other sentinels are named up front (as a sentinel writes
        # them into its own file): found by themselves, they take a 10 s INFO period.
        known = [f"sentinel known-replica {SERVICE} 127.0.0.1 {r.port}" for r in self.replicas]
        known += [
            f"sentinel known-sentinel {SERVICE} 127.0.0.1 {other} {_sentinel_id(m)}"
            for m, other in enumerate(self.sentinel_ports)
            if other != port
        ]
        config.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {home}\nlogfile {home / 'sentinel.log'}\n"
            f"sentinel myid {_sentinel_id(n)}\n"
            f"requirepass {self.sentinel_password}\n"
            f"sentinel sentinel-pass {self.sentinel_password}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {SERVICE} {len(self.replicas)}\n" + "\n".join(known) + "\n"
        )
        return subprocess.Popen([self.binary, str(config)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip

    def _wait_ready(self, timeout_s: float) -> None:
        """Until every sentinel knows every replica and the other sentinels."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._ready(port) for port in self.sentinel_ports):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the sentinels did not find each other in {timeout_s}s")

    def _ready(self, port: int) -> bool:
        client = self._sentinel(port)
        try:
            state = client.sentinel_master(SERVICE)
        except redis.RedisError:
            return False
        finally:
            client.close()
        others = len(self.sentinel_ports) - 1
        return bool(
            int(state["num-slaves"]) == len(self.replicas)
            and int(state["num-other-sentinels"]) == others
        )

    def primary_port(self) -> int:
        """The port of the primary as a sentinel that answers names it now."""
        for port in self.sentinel_ports:
            client = self._sentinel(port)
            try:
                _, primary = client.sentinel_get_master_addr_by_name(SERVICE)
                return int(primary)
            except (redis.RedisError, TypeError):
                continue
            finally:
                client.close()
        raise RuntimeError("no sentinel answers")

    def server_on(self, port: int) -> RedisServer:
        return next(server for server in self.servers if server.port == port)

    def stop(self) -> None:
        for process in self._sentinels:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        for process in self._sentinels:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
        self._sentinels.clear()
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.stop()

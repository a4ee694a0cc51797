"""Processes of a partition test, each in its namespace of a :class:`~tests.support.netns.Lab`:
redis-server in the hub (:class:`HubRedis`), workers (:class:`NamespacedPool`) and a
client program (:func:`start_client`) in hosts of their own.

Every process is started through ``setpriv --pdeathsig KILL -- ip netns exec NS``: the
exec chain keeps one pid, so killing, stopping and the worker's own ``os.getpid()`` all
name the same process, and it dies with the thread that started it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.netns import Host, Lab
from tests.support.redis_server import RedisServer, redis_server_binary
from tests.support.workers import ROOT, WorkerPool, WorkerProcess, worker_env


class HubRedis(RedisServer):
    """A redis-server in the lab's hub namespace, listening on the hub address only.

    :class:`RedisServer` binds 127.0.0.1 (the hub's own loopback here); a wrapper runs it
    in the namespace and binds the hub address instead (the last ``--bind`` wins)."""

    def __init__(self, directory: Path, lab: Lab) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        wrapper = directory / "redis-server-in-hub"
        prefix = " ".join(["setpriv", "--pdeathsig", "KILL", "--", lab.ip, "netns", "exec",
                           lab.hub])  # fmt: skip
        wrapper.write_text(
            "#!/bin/sh\n"
            f'exec {prefix} {redis_server_binary()} "$@"'
            f" --bind {lab.hub_address} --protected-mode no\n"
        )
        wrapper.chmod(0o755)
        super().__init__(directory, str(wrapper))
        self.host = lab.hub_address

    def url_as(self, username: str = "", password: str = "", **query: str) -> str:
        assert not (username or password or query), "the hub's Redis has no auth or TLS"
        return f"redis://{self.host}:{self.port}/0"


class NamespacedWorker(WorkerProcess):
    """A worker process run inside ``host``'s namespace."""

    def __init__(self, env: dict[str, str], log_dir: Path, host: Host, ip: str,
                 partitions: str | None = None) -> None:  # fmt: skip
        super().__init__(env, log_dir, partitions=partitions)
        self.host = host
        self.ip = ip

    def command(self) -> list[str]:
        return [*self.host.run_prefix(self.ip), *super().command()]


class NamespacedPool(WorkerPool):
    """A :class:`WorkerPool` whose workers each run in a host of ``lab``."""

    def __init__(self, lab: Lab, redis_url: str, log_dir: Path, **settings: Any) -> None:
        super().__init__(redis_url, log_dir, **settings)
        self.lab = lab

    def start_in(self, hosts: list[Host], partitions: list[str | None]) -> None:
        """One worker in each of ``hosts`` (with its partitions), all ready on return."""
        started = [
            NamespacedWorker(self.env, self.log_dir, host, self.lab.ip, spec).start()
            for host, spec in zip(hosts, partitions, strict=True)
        ]
        self.workers.extend(started)
        for worker in started:
            worker.wait_ready(60)

    def worker_of(self, pid: int) -> NamespacedWorker | None:
        for worker in self.workers:
            if isinstance(worker, NamespacedWorker) and worker.alive() and worker.pid == pid:
                return worker
        return None


@contextmanager
def running_client(
    lab: Lab, host: Host, pool: WorkerPool, plan: dict[str, Any], out: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """:mod:`tests.support.partition_client` run in ``host`` with ``plan``; each turn it
    submitted is a JSON line of ``out``. Killed on exit if still running."""
    env = worker_env(pool.redis_url, pool.prefix, partitions=pool.partitions)
    plan_file = out.with_suffix(".plan.json")
    plan_file.write_text(json.dumps({**plan, "out": str(out)}))
    log = open(out.with_suffix(".log"), "ab")  # noqa: SIM115  (the child keeps it open)
    process = subprocess.Popen(
        [*host.run_prefix(lab.ip), sys.executable, "-m", "tests.support.partition_client",
         str(plan_file)],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    log.close()
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)

"""convoq next to what users would pick instead, measured side by side in one run on one
redis-server (the system's, else the embedded one): three runs, medians and ranges, one
table. The numbered rows are the bars of the performance work (see bench/README.md).

Peers (``bench.peers``): OpenAI Agents' RedisSession, langchain-community's
RedisChatMessageHistory, a bare Celery task with a Redis result backend and ``.get()``, and
a hand-built Celery task (RedisSession last 10 turns + model + ``add_items``).

Run ``python -m bench compare`` (``make bench`` installs the peers and runs everything).
This module is also the agent profile module of the convoq workers it starts.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import redis

from convoq import Agent
from convoq.models import ModelRequest, ScriptedModel

ROOT = Path(__file__).resolve().parents[1]
RUNS = 3


# -- the agents of the convoq workers ---------------------------------------------------------
async def _half_second(_request: ModelRequest) -> str:
    await asyncio.sleep(0.5)
    return "ok"


def _blocking_half_second(_request: ModelRequest) -> str:
    time.sleep(0.5)  # a sync model function, as users write them
    return "ok"


async def _at_once(_request: ModelRequest) -> str:
    # Async, like a model client awaiting its server: a sync function would run on the
    # worker's blocking-call threads, a thread hop per call.
    return "ok"


zero = Agent(ScriptedModel(_at_once, name="zero"), name="zero")
slow = Agent(ScriptedModel(_half_second, name="slow"), name="slow")
blocking = Agent(ScriptedModel(_blocking_half_second, name="blocking"), name="blocking")


# -- the table ---------------------------------------------------------------------------------
class Row:
    """One measured figure: a value per run, shown as median [min-max]."""

    def __init__(self, item: str, what: str, unit: str) -> None:
        self.item, self.what, self.unit = item, what, unit
        self.values: list[float] = []

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def shown(self) -> str:
        if not self.values:
            return "n/a"
        low, high = min(self.values), max(self.values)
        digits = 3 if self.median < 10 else 1
        return f"{self.median:.{digits}f} [{low:.{digits}f}-{high:.{digits}f}] {self.unit}"


class Table:
    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.checks: list[tuple[str, Callable[[], tuple[str, bool]]]] = []

    def add(self, key: str, item: str, what: str, unit: str, value: float) -> None:
        self.rows.setdefault(key, Row(item, what, unit)).values.append(value)

    def bar(self, item: str, check: Callable[[], tuple[str, bool]]) -> None:
        self.checks.append((item, check))

    def render(self) -> str:
        width = max(len(r.what) for r in self.rows.values()) + 2
        lines = [f"{'item':<5}{'measured':<{width}}median [min-max] of {RUNS} runs"]
        for row in self.rows.values():
            lines.append(f"{row.item:<5}{row.what:<{width}}{row.shown()}")
        lines.append("")
        lines.append("bars (ratios of medians from this run):")
        for item, check in self.checks:
            try:
                text, met = check()
            except (KeyError, statistics.StatisticsError, ZeroDivisionError) as exc:
                text, met = f"not measured ({exc})", False
            lines.append(f"  {item:<4} {'MET ' if met else 'NOT '} {text}")
        return "\n".join(lines)


# -- infrastructure ----------------------------------------------------------------------------
@contextmanager
def redis_server(directory: Path) -> Iterator[str]:
    """A private redis-server (AOF everysec) on a free port; its URL."""
    import socket

    binary = shutil.which("redis-server")
    if binary is None:
        from convoq.redis import embedded

        url = embedded.embedded_url(directory)
        try:
            yield url
        finally:
            embedded.stop(directory)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
               "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    try:
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.02)
        yield url
    finally:
        client.close()
        server.terminate()
        server.wait(10)


def worker_env(url: str, prefix: str, home: Path, concurrency: int) -> dict[str, str]:
    # The fast-paths switch passes through: `CONVOQ_FAST_PATHS=off python -m bench ...`
    # measures what the shortcuts save.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOQ_")}
    if "CONVOQ_FAST_PATHS" in os.environ:
        env["CONVOQ_FAST_PATHS"] = os.environ["CONVOQ_FAST_PATHS"]
    env.update(
        CONVOQ_REDIS_URL=url,
        CONVOQ_PREFIX=prefix,
        CONVOQ_HOME=str(home),
        CONVOQ_AGENTS="bench.compare",
        CONVOQ_CONCURRENCY=str(concurrency),
        BENCH_REDIS_URL=url,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    return env


def start_convoq_worker(stack: ExitStack, env: dict[str, str], home: Path, client: Any) -> None:
    from convoq.worker._spawn import worker_process

    name = f"bench-{uuid.uuid4().hex[:6]}@localhost"
    log = home / f"{name}.log"
    stack.enter_context(
        worker_process(name, env, log, "--loglevel=warning", registered=client.workers, cwd=ROOT)
    )


def start_peer_worker(stack: ExitStack, env: dict[str, str], home: Path) -> None:
    from bench import peers
    from convoq.worker._spawn import process

    command = [sys.executable, "-m", "celery", "-A", "bench.peers:celery_app", "worker",
               "--pool=threads", "--concurrency=100", f"--queues={peers.QUEUE}",
               "--loglevel=warning", "--without-mingle", "--without-gossip",
               "--hostname=peers@localhost"]  # fmt: skip
    stack.enter_context(process(command, env, home / "peers.log", cwd=ROOT))
    peers.celery_app.send_task("bench.bare", args=["ready"]).get(timeout=60)


def main() -> None:
    from bench import compare_runs

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="convoq-bench-") as tmp:
        home = Path(tmp)
        (home / "redis").mkdir()
        with redis_server(home / "redis") as url:
            version = redis.Redis.from_url(url).info()["redis_version"]
            print(f"redis-server {version}, AOF everysec; {os.cpu_count()} CPUs", flush=True)
            table = compare_runs.run_all(url, home)
    print(table.render())
    print(f"(took {time.monotonic() - started:.0f}s)")


if __name__ == "__main__":
    main()

"""Scaling: turns per second against worker processes (1, 2, 4) and Redis shards (one
Redis, then a Redis Cluster of 3 primaries + 3 replicas) with a zero-latency and a 500 ms
model at 1,000 conversations; and what each turn costs Redis: CPU (``INFO
commandstats`` usec and the server's own CPU time, deltas) and memory (``used_memory``
delta, and ``MEMORY USAGE`` of the history alone).

The Celery broker is a separate Redis in both set-ups (Celery cannot use a cluster), so
the store figures are the store's alone; the broker's CPU per turn is printed too. Every
server is a local redis-server (AOF on, ``appendfsync everysec``). The numbers feed the
capacity model in bench/README.md. ``python -m bench.scaling [--quick]`` (``--quick``: 1 and 2
processes only; ``BENCH_QUICK=1`` does the same under ``make bench``). This module is also
the workers' profile module.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from bench._redis_stats import Usage, history_bytes, usage
from convoq import Agent
from convoq.client import AsyncClient, Client
from convoq.models import ModelRequest, ScriptedModel
from convoq.worker._spawn import worker_process

ROOT = Path(__file__).resolve().parents[1]
CONVERSATIONS = 1000
CONCURRENCY = 100  # turns in flight per worker process
QUESTION = "Please summarise the attached quarterly notes in three bullet points. " * 4
ANSWER = "Revenue grew 4%; churn fell to 2.1%; two hires are planned for Q3. " * 6


# -- what the worker processes load ----------------------------------------------------------
async def _half_second(_request: ModelRequest) -> str:
    await asyncio.sleep(0.5)
    return ANSWER


zero = Agent(ScriptedModel(lambda _request: ANSWER, name="zero"), name="zero")
slow = Agent(ScriptedModel(_half_second, name="slow"), name="slow")


# -- servers ---------------------------------------------------------------------------------
@dataclass
class Store:
    name: str
    url: str
    primaries: list[int]


@contextmanager
def _servers(home: Path) -> Iterator[tuple[str, list[Store]]]:
    """A broker Redis, a one-Redis store and a 3+3 cluster store (the test fixtures)."""
    sys.path.insert(0, str(ROOT))
    from tests.support.redis_cluster import RedisClusterNodes, redis_cli_binary
    from tests.support.redis_server import RedisServer

    with ExitStack() as stack:
        broker, single = RedisServer(home / "broker"), RedisServer(home / "single")
        for server in (broker, single):
            server.start()
            stack.callback(server.stop)
            _everysec(server.port)
        stores = [Store("1 Redis", single.url, [single.port])]
        cli = redis_cli_binary()
        if cli is None:
            print("(no redis-cli: the cluster rows are skipped)")
        else:
            cluster = RedisClusterNodes(home / "cluster", cli)
            cluster.start()
            stack.callback(cluster.stop)
            stores.append(Store("cluster 3+3", cluster.url, cluster.primaries()))
        yield broker.url, stores


def _everysec(port: int) -> None:
    r = redis.Redis(port=port)
    try:
        r.config_set("appendfsync", "everysec")
    finally:
        r.close()


# -- workers ---------------------------------------------------------------------------------
def _env(store: Store, broker: str, prefix: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOQ_")}
    env.update(
        CONVOQ_REDIS_URL=store.url,
        CONVOQ_BROKER_URL=broker,
        CONVOQ_PREFIX=prefix,
        CONVOQ_HOME=str(home),
        CONVOQ_AGENTS="bench.scaling",
        CONVOQ_CONCURRENCY=str(CONCURRENCY),
        CONVOQ_TASK_EVENTS="false",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    return env


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- one measurement -------------------------------------------------------------------------
@dataclass
class Row:
    store: str
    processes: int
    model: str
    turns: int
    seconds: float
    store_cost: Usage
    broker_cost: Usage
    worker_cpu_s: float
    history_bytes: float

    @property
    def rate(self) -> float:
        return self.turns / self.seconds


async def _turns(client: AsyncClient, agent: str, conversations: int, tag: str) -> int:
    """Queue a turn on each of ``conversations`` fresh conversations at once and wait for
    all; returns the number of turns."""

    async def one(cid: str) -> list[object]:
        return [await client.submit(cid, QUESTION, agent=agent)]

    groups = await asyncio.gather(*(one(f"{tag}-{i}") for i in range(conversations)))
    handles = [h for group in groups for h in group]
    await asyncio.gather(*(h.wait(600) for h in handles))  # type: ignore[attr-defined]
    return len(handles)


def _measure(
    store: Store,
    broker: str,
    prefix: str,
    pids: list[int],
    agent: str,
    conversations: int = CONVERSATIONS,
) -> Row:
    tag = f"{agent}-{uuid.uuid4().hex[:6]}"
    store_before, broker_before = usage(store.url, store.primaries), usage(broker, [])
    cpu_before = sum(_cpu_s(pid) for pid in pids)

    async def go() -> int:
        async with AsyncClient(
            store.url, broker_url=broker, prefix=prefix, agents=["zero", "slow"]
        ) as client:
            return await _turns(client, agent, conversations, tag)

    started = time.perf_counter()
    turns = asyncio.run(go())
    seconds = time.perf_counter() - started
    return Row(
        store=store.name,
        processes=len(pids),
        model="zero latency" if agent == "zero" else "500 ms",
        turns=turns,
        seconds=seconds,
        store_cost=usage(store.url, store.primaries) - store_before,
        broker_cost=usage(broker, []) - broker_before,
        worker_cpu_s=sum(_cpu_s(pid) for pid in pids) - cpu_before,
        history_bytes=history_bytes(store.url, prefix, [f"{tag}-{i}" for i in range(50)]),
    )


def _store_rows(store: Store, broker: str, home: Path, quick: bool) -> list[Row]:
    prefix = f"scale{uuid.uuid4().hex[:6]}"
    env = _env(store, broker, prefix, home)
    rows: list[Row] = []
    with ExitStack() as stack:
        client = stack.enter_context(Client(store.url, broker_url=broker, prefix=prefix))
        pids: list[int] = []
        for target in (1, 2) if quick else (1, 2, 4):
            while len(pids) < target:
                name = f"scale-{uuid.uuid4().hex[:6]}@localhost"
                log = home / f"{name}.log"
                child = stack.enter_context(
                    worker_process(
                        name, env, log, "--loglevel=warning", registered=client.workers, cwd=ROOT
                    )
                )
                pids.append(child.pid)
            if target == 1:  # untimed warm-up: connections, scripts, imports
                _measure(store, broker, prefix, pids, "zero", 50)
            for agent in ("zero", "slow"):
                rows.append(_measure(store, broker, prefix, pids, agent))
                _print_row(rows[-1])
    return rows


# -- the report ------------------------------------------------------------------------------
def _print_header() -> None:
    print(
        f"{CONVERSATIONS} conversations at once, {CONCURRENCY} turns in flight per worker"
        " process (threads pool); store CPU = the store's primaries\n"
    )
    print(
        "   store        procs  model         turns  turns/s  store cmd us/turn"
        "  store cpu us/turn  broker cpu us/turn  worker cpu ms/turn  store bytes/turn"
    )


def _print_row(row: Row) -> None:
    s, b, n = row.store_cost, row.broker_cost, row.turns
    print(
        f"   {row.store:<12} {row.processes:>5}  {row.model:<12} {n:>6}  {row.rate:7.1f}"
        f"  {s.command_us / n:17.1f}  {s.cpu_s * 1e6 / n:17.1f}  {b.cpu_s * 1e6 / n:18.1f}"
        f"  {row.worker_cpu_s * 1e3 / n:18.2f}  {s.memory / n:16.0f}",
        flush=True,
    )


def _print_summary(rows: list[Row]) -> None:
    zero_rows = [r for r in rows if r.model == "zero latency"]
    turns = sum(r.turns for r in zero_rows)
    per_turn = {
        "store command us": sum(r.store_cost.command_us for r in zero_rows) / turns,
        "store cpu us": sum(r.store_cost.cpu_s for r in zero_rows) * 1e6 / turns,
        "broker cpu us": sum(r.broker_cost.cpu_s for r in zero_rows) * 1e6 / turns,
        "worker cpu ms": sum(r.worker_cpu_s for r in zero_rows) * 1e3 / turns,
        "store bytes (records kept)": sum(r.store_cost.memory for r in rows)
        / sum(r.turns for r in rows),
        "history bytes (records expired)": sum(r.history_bytes for r in rows) / len(rows),
    }
    top = sum((r.store_cost.by_command for r in zero_rows), Counter()).most_common(6)
    shown = ", ".join(f"{name} {us / turns:.0f}" for name, us in top)
    print(f"\n   store command us per turn, top commands (zero-latency rows): {shown}")
    print("\n   per turn, over the zero-latency rows (memory: over all rows):")
    for name, value in per_turn.items():
        print(f"   {name:<34} {value:10.1f}")
    print(f"   load average now: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


def run(quick: bool = False) -> None:
    print(f"{os.cpu_count()} cores, shared with other work; load {os.getloadavg()[0]:.1f}")
    _print_header()
    rows: list[Row] = []
    with (
        tempfile.TemporaryDirectory(prefix="convoq-scale-") as tmp,
        _servers(Path(tmp)) as (
            broker,
            stores,
        ),
    ):
        for store in stores:
            rows += _store_rows(store, broker, Path(tmp), quick)
    _print_summary(rows)


def main() -> None:
    started = time.monotonic()
    run(quick="--quick" in sys.argv[1:] or os.environ.get("BENCH_QUICK") == "1")
    print(f"\n(took {time.monotonic() - started:.0f}s)")


if __name__ == "__main__":
    main()

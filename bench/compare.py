"""convoq next to what users would pick instead, each system on its own private
redis-server (all configured alike: ``bench._harness.PERSISTENCE``), every history
populated before anything is timed, the systems alternating round by round. Each row is
a median [min-max] over rounds of a round's figure; each ratio is taken round by round
(two systems of the same round) and shown as median [min-max] of those per-round ratios.
A bar is met only when every round's ratio meets it.

Systems: convoq, convoq with ``CONVOQ_FAST_PATHS=off`` (its own worker, client and
memory in that mode), a bare Celery task with a Redis result backend and ``.get()``, a
hand-built Celery task (RedisSession last 10 turns + model + ``add_items``; for a burst
also as a Celery chain per conversation, the peer that keeps each conversation's turns in
order), OpenAI Agents' RedisSession alone and langchain-community's
RedisChatMessageHistory (``bench.peers``).

Run ``python -m bench compare`` (``--quick`` or ``BENCH_QUICK=1``: fewer rounds).
This module is also the agent profile module of the convoq workers it starts.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen
from typing import Any

from celery import Celery

from bench._harness import PERSISTENCE_TEXT, quick, ratios, spread
from bench.peers import REPLIES
from convoq import Agent
from convoq.models import ModelRequest, ScriptedModel

ROOT = Path(__file__).resolve().parents[1]
FULL_SIZES = (1_000, 10_000)  # stored turns of the whole-history loads


# -- the agents of the convoq workers ---------------------------------------------------------
async def _half_second(_request: ModelRequest) -> str:
    await asyncio.sleep(0.5)
    return "ok"


async def _at_once(_request: ModelRequest) -> str:
    # Async, like a model client awaiting its server.
    return REPLIES["ok"]


async def _at_once_300(_request: ModelRequest) -> str:
    return REPLIES["300"]


def _at_once_sync(_request: ModelRequest) -> str:
    return REPLIES["ok"]  # a plain function, as users write them


# The last 10 turns go to the model, as the hand-built task's ``get_items(limit=20)``
# (an Agent's default, keep_last_turns=0, sends the whole history).
WINDOW = 10
zero = Agent(ScriptedModel(_at_once, name="zero"), name="zero", keep_last_turns=WINDOW)
zero300 = Agent(ScriptedModel(_at_once_300, name="zero300"), name="zero300",
                keep_last_turns=WINDOW)  # fmt: skip
zerosync = Agent(ScriptedModel(_at_once_sync, name="zerosync"), name="zerosync",
                 keep_last_turns=WINDOW)  # fmt: skip
slow = Agent(ScriptedModel(_half_second, name="slow"), name="slow")


# -- the table ---------------------------------------------------------------------------------
@dataclass
class Row:
    """One measured figure: one value per round."""

    section: str
    what: str
    unit: str
    values: list[float]


@dataclass
class Ratio:
    """``a / b`` round by round; with a bar (``op`` "<=" or ">=", ``limit``) when it is one.
    Without ``b``: ``a``'s own values against the bar."""

    what: str
    a: str
    b: str | None
    op: str = ""
    limit: float = 0.0

    def values(self, rows: dict[str, Row]) -> list[float]:
        if self.b is None:
            return rows[self.a].values
        return ratios(rows[self.a].values, rows[self.b].values)

    def met(self, values: list[float]) -> bool:
        """Every round's value meets the bar: a range that crosses it is not met."""
        if self.op == "<=":
            return max(values) <= self.limit
        return min(values) >= self.limit


class Table:
    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.ratios: list[Ratio] = []
        self.bars: list[Ratio] = []

    def add(self, key: str, section: str, what: str, unit: str, value: float) -> None:
        self.rows.setdefault(key, Row(section, what, unit, [])).values.append(value)

    def ratio(self, what: str, a: str, b: str) -> None:
        self.ratios.append(Ratio(what, a, b))

    def bar(self, what: str, a: str, b: str | None, op: str, limit: float) -> None:
        self.bars.append(Ratio(what, a, b, op, limit))

    def render(self) -> str:
        width = max(len(r.what) for r in self.rows.values()) + 2
        lines = [f"{'measured':<{width}}median [min-max] over rounds (rounds)"]
        section = ""
        for row in self.rows.values():
            if row.section != section:
                section = row.section
                lines.append(f"-- {section}")
            digits = 3 if statistics.median(row.values) < 10 else 1
            shown = f"{spread(row.values, digits)} {row.unit}"
            lines.append(f"{row.what:<{width}}{shown} ({len(row.values)})")
        lines += ["", "ratios, round by round: median [min-max] of the per-round ratios"]
        width = max(len(r.what) for r in [*self.ratios, *self.bars]) + 2
        for r in self.ratios:
            lines.append(f"  {r.what:<{width}}{self._shown(r)}")
        lines += ["", "bars (met only when every round meets it):"]
        for r in self.bars:
            try:
                values = r.values(self.rows)
                verdict = "MET " if r.met(values) else "NOT "
                shown = f"{spread(values)}  (bar {r.op} {r.limit:g})"
            except (KeyError, ValueError, ZeroDivisionError) as exc:
                verdict, shown = "NOT ", f"not measured ({exc!r})"
            lines.append(f"  {verdict} {r.what:<{width}}{shown}")
        return "\n".join(lines)

    def _shown(self, r: Ratio) -> str:
        try:
            return spread(r.values(self.rows))
        except (KeyError, ValueError, ZeroDivisionError) as exc:
            return f"not measured ({exc!r})"


# -- workers -----------------------------------------------------------------------------------
def worker_env(
    url: str, prefix: str, home: Path, concurrency: int, fast_paths: str | None = None
) -> dict[str, str]:
    """The environment of a convoq worker (agents from this module) or a peer worker on
    the server at ``url``. ``fast_paths`` sets ``CONVOQ_FAST_PATHS``; else the caller's
    passes through (``CONVOQ_FAST_PATHS=off python -m bench fair``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOQ_")}
    if fast_paths is not None:
        env["CONVOQ_FAST_PATHS"] = fast_paths
    elif "CONVOQ_FAST_PATHS" in os.environ:
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


def start_convoq_worker(stack: ExitStack, env: dict[str, str], home: Path, client: Any) -> Popen:
    """A convoq worker process, once registered; stopped when ``stack`` closes."""
    from convoq.worker._spawn import worker_process

    name = f"bench-{uuid.uuid4().hex[:6]}@localhost"
    log = home / f"{name}.log"
    return stack.enter_context(
        worker_process(name, env, log, "--loglevel=warning", registered=client.workers, cwd=ROOT)
    )


def start_peer_worker(stack: ExitStack, env: dict[str, str], home: Path, app: Celery) -> Popen:
    """A Celery worker of ``bench.peers`` (threads pool, 100 threads: convoq's slots) on
    ``env``'s server, once it answers a task sent through ``app``."""
    from bench import peers
    from convoq.worker._spawn import process

    name = f"peers-{uuid.uuid4().hex[:6]}"
    command = [sys.executable, "-m", "celery", "-A", "bench.peers:celery_app", "worker",
               "--pool=threads", "--concurrency=100", f"--queues={peers.QUEUE}",
               "--loglevel=warning", "--without-mingle", "--without-gossip",
               f"--hostname={name}@localhost"]  # fmt: skip
    child = stack.enter_context(process(command, env, home / f"{name}.log", cwd=ROOT))
    app.send_task("bench.bare", args=["ready"]).get(timeout=60)
    return child


_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU time of ``pid`` and its descendants, in seconds: each live thread's run time in
    nanoseconds (``/proc/<pid>/task/<tid>/schedstat``), plus the reaped children's
    cutime + cstime (``/proc/<pid>/stat``, clock ticks)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, field 3 is first
    total = sum(int(f) for f in fields[13:15]) / _TICKS  # cutime cstime
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0]) / 1e9
            children = (task / "children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
        total += sum(process_cpu_s(int(child)) for child in children)
    return total


def main() -> None:
    from bench import compare_memory, compare_runs

    started = time.monotonic()
    rounds = "quick" if quick() else "full"
    print(f"private redis-server per system ({PERSISTENCE_TEXT}); {rounds} rounds", flush=True)
    table = Table()
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="convoq-bench-") as tmp:
        compare_memory.run(Path(tmp) / "memory", table)
        loads.append(os.getloadavg()[0])
        print(f"(memory rows done after {time.monotonic() - started:.0f}s)", flush=True)
        compare_runs.run(Path(tmp) / "queued", table)
    loads.append(os.getloadavg()[0])
    _bars(table)
    print(table.render())
    shown = " / ".join(f"{load:.2f}" for load in loads)
    print(f"load average (1 min) at the start / after the memory rows / at the end: {shown}")
    print(f"(took {time.monotonic() - started:.0f}s)")


def _bars(t: Table) -> None:
    for size in FULL_SIZES:
        t.bar(f"full load at {size:,}: convoq / RedisSession", f"full{size}-convoq",
              f"full{size}-session", "<=", 1.0)  # fmt: skip
    for size in (10, 1_000, 10_000):
        for system in ("convoq", "sync"):
            t.bar(f"last 10 turns of {size:,}: {system} / RedisSession", f"win{size}-{system}",
                  f"win{size}-session", "<=", 1.0)  # fmt: skip
    for op in ("append", "load-10"):
        t.bar(f"memory from a URL, async {op} / given a client", f"{op}-url", f"{op}-client",
              "<=", 1.1)  # fmt: skip
    t.bar("worker CPU per turn (burst): convoq / hand-built", "cpu-burst-convoq",
          "cpu-burst-hand", "<=", 1.0)  # fmt: skip
    t.bar("worker CPU per turn (one at a time): convoq / hand-built", "cpu1-convoq",
          "cpu1-hand", "<=", 1.0)  # fmt: skip
    t.bar("burst, ok: convoq / hand-built ordered chain", "burst-convoq", "burst-chain",
          ">=", 1.0)  # fmt: skip
    t.bar("burst, ok: convoq / bare Celery", "burst-convoq", "burst-bare", ">=", 0.6)
    t.bar("burst: convoq, 300-byte reply / ok", "burst300-convoq", "burst-convoq", ">=", 0.9)
    t.bar("burst, 300-byte reply: convoq / bare Celery", "burst300-convoq", "burst300-bare",
          ">=", 1.0)  # fmt: skip
    t.bar("burst, 300-byte reply, 10 stored turns: convoq / bare Celery", "burst10x300-convoq",
          "burst10x300-bare", ">=", 1.0)  # fmt: skip
    t.bar("round trip, ok, new conv: convoq / bare Celery", "new-convoq", "new-bare",
          "<=", 1.3)  # fmt: skip
    t.bar("Redis commands per turn, new conversation: convoq", "cmds-convoq", None, "<=", 35)
    t.bar("Redis commands per turn, 10 stored turns: convoq", "cmds10-convoq", None, "<=", 35)


if __name__ == "__main__":
    main()

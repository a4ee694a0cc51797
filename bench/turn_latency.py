"""Turn latency and throughput of convoq workers, next to a bare Celery round trip.

1. Per-turn overhead: median submit-to-result latency of a turn whose scripted model
   answers at once, against a trivial Celery task with a Redis result backend awaited
   with ``.get()`` (what a Celery user measures), on the same broker (one embedded
   Redis), measured side by side in one run.
2. Concurrency: turns per second with a model that sleeps 500 ms per call, as concurrent
   conversations grow (1, 10, 100), by one worker process, then by two.

Run ``python -m bench.turn_latency`` (or ``make bench``). This module is also the profile
module of the workers it starts (``CONVOQ_AGENTS=bench.turn_latency``) and the Celery app
of the bare worker (``celery -A bench.turn_latency:bare_app``).
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
from pathlib import Path

from celery import Celery

from convoq import Agent
from convoq.client import AsyncClient, Client
from convoq.models import ModelRequest, ScriptedModel
from convoq.queue.transport import broker_url_for, celery_base_config
from convoq.worker._spawn import process, worker_process

ROOT = Path(__file__).resolve().parents[1]
BARE_QUEUE = "bench.bare"
WORKER_CONCURRENCY = 100


# -- what the worker processes load ----------------------------------------------------------
async def _half_second(_request: ModelRequest) -> str:
    await asyncio.sleep(0.5)
    return "ok"


zero = Agent(ScriptedModel(lambda _request: "ok", name="zero"), name="zero")
slow = Agent(ScriptedModel(_half_second, name="slow"), name="slow")

_url = os.environ.get("CONVOQ_REDIS_URL", "redis://127.0.0.1:6379/0")
bare_app = Celery("bench-bare", set_as_current=False)
bare_app.conf.update(celery_base_config(broker_url_for(_url)), task_default_queue=BARE_QUEUE)
bare_app.conf.update(result_backend=broker_url_for(_url), task_ignore_result=False)


@bare_app.task(name="bench.ping")
def ping(value: str) -> str:
    """The trivial task: its result is its argument."""
    return value


# -- processes -------------------------------------------------------------------------------
def _start_worker(stack: ExitStack, env: dict[str, str], home: Path, client: Client) -> None:
    name = f"bench-{uuid.uuid4().hex[:6]}@localhost"
    log = home / f"{name}.log"
    worker = worker_process(
        name, env, log, "--loglevel=warning", registered=client.workers, cwd=ROOT
    )
    stack.enter_context(worker)


def _start_bare_worker(stack: ExitStack, env: dict[str, str], home: Path) -> None:
    command = [sys.executable, "-m", "celery", "-A", "bench.turn_latency:bare_app", "worker",
               "--pool=threads", "--concurrency=4", f"--queues={BARE_QUEUE}",
               "--loglevel=warning", "--without-mingle", "--without-gossip",
               "--hostname=bare@localhost"]  # fmt: skip
    stack.enter_context(process(command, env, home / "bare.log", cwd=ROOT))
    # Ready when a ping comes back.
    bare_app.send_task("bench.ping", args=["ready"], queue=BARE_QUEUE).get(timeout=60)


# -- measurements ----------------------------------------------------------------------------
def convoq_latency(client: Client, turns: int) -> list[float]:
    """Submit-to-result seconds of ``turns`` sequential turns (fresh conversations)."""
    samples = []
    for _ in range(turns):
        started = time.perf_counter()
        client.submit(f"lat-{uuid.uuid4().hex[:10]}", "hi", agent="zero").wait(30)
        samples.append(time.perf_counter() - started)
    return samples


def bare_latency(url: str, rounds: int) -> list[float]:
    """Send-to-result seconds of ``rounds`` sequential bare Celery tasks (``.get()``)."""
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        bare_app.send_task("bench.ping", args=["hi"], queue=BARE_QUEUE).get(timeout=30)
        samples.append(time.perf_counter() - started)
    return samples


async def throughput(client: AsyncClient, conversations: int, per_conversation: int) -> float:
    """Turns per second for ``conversations`` conversations, each with queued turns."""

    async def one(cid: str) -> list[object]:
        return [
            await client.submit(cid, f"turn {i}", agent="slow") for i in range(per_conversation)
        ]

    started = time.perf_counter()
    groups = await asyncio.gather(
        *(one(f"tp-{uuid.uuid4().hex[:10]}") for _ in range(conversations))
    )
    handles = [h for group in groups for h in group]
    await asyncio.gather(*(h.wait(300) for h in handles))  # type: ignore[attr-defined]
    return len(handles) / (time.perf_counter() - started)


async def _throughputs(url: str, prefix: str, shapes: list[tuple[int, int]]) -> list[float]:
    async with AsyncClient(url, prefix=prefix) as client:
        return [await throughput(client, c, k) for c, k in shapes]


# -- the run ---------------------------------------------------------------------------------
def _env(url: str, prefix: str, home: Path) -> dict[str, str]:
    # The fast-paths switch passes through: `CONVOQ_FAST_PATHS=off python -m bench ...`
    # measures what the shortcuts save.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOQ_")}
    if "CONVOQ_FAST_PATHS" in os.environ:
        env["CONVOQ_FAST_PATHS"] = os.environ["CONVOQ_FAST_PATHS"]
    env.update(
        CONVOQ_REDIS_URL=url,
        CONVOQ_PREFIX=prefix,
        CONVOQ_HOME=str(home),
        CONVOQ_AGENTS="bench.turn_latency",
        CONVOQ_CONCURRENCY=str(WORKER_CONCURRENCY),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    return env


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(len(ordered) * 0.9) - 1]
    return f"median {statistics.median(samples) * 1000:6.2f} ms   p90 {p90 * 1000:6.2f} ms"


def run(rounds: int = 200) -> None:
    """Run both benchmarks on a private embedded Redis and print the results."""
    from convoq.redis import embedded

    with tempfile.TemporaryDirectory(prefix="convoq-bench-") as tmp, ExitStack() as stack:
        home = Path(tmp)
        url = embedded.embedded_url(home)
        stack.callback(embedded.stop, home)
        env = _env(url, f"bench{uuid.uuid4().hex[:6]}", home)
        bare_app.conf.update(broker_url=broker_url_for(url), result_backend=broker_url_for(url))
        client = stack.enter_context(Client(url, prefix=env["CONVOQ_PREFIX"]))
        _start_bare_worker(stack, env, home)
        _start_worker(stack, env, home, client)
        print(f"Redis {url}; workers: threads pool, concurrency {WORKER_CONCURRENCY}\n")
        convoq_latency(client, 20)  # warm-up
        bare_latency(url, 20)
        ours, bare = convoq_latency(client, rounds), bare_latency(url, rounds)
        print(f"1. per-turn overhead ({rounds} sequential round trips each, same broker)")
        print(f"   bare Celery task, .get()      {_ms(bare)}")
        print(f"   convoq turn, zero-latency model {_ms(ours)}")
        ratio = statistics.median(ours) / statistics.median(bare)
        print(f"   ratio convoq / bare (median)  {ratio:.1f}x\n")
        _concurrency(stack, env, home, client)


def _concurrency(stack: ExitStack, env: dict[str, str], home: Path, client: Client) -> None:
    url, shapes = client.redis_url, [(1, 4), (10, 4), (100, 4)]
    one = asyncio.run(_throughputs(url, env["CONVOQ_PREFIX"], shapes))
    _start_worker(stack, env, home, client)
    two = asyncio.run(_throughputs(url, env["CONVOQ_PREFIX"], [(100, 4), (200, 4)]))
    print("2. throughput, model sleeping 500 ms per call (4 queued turns per conversation)")
    print("   conversations  processes  turns/s   (ideal)")
    for (conversations, _), rate in zip(shapes, one, strict=True):
        ideal = 2 * min(conversations, WORKER_CONCURRENCY)
        print(f"   {conversations:>13}  {1:>9}  {rate:7.1f}   ({ideal})")
    for conversations, rate in zip((100, 200), two, strict=True):
        ideal = 2 * min(conversations, 2 * WORKER_CONCURRENCY)
        print(f"   {conversations:>13}  {2:>9}  {rate:7.1f}   ({ideal})")


def main() -> None:
    started = time.monotonic()
    run()
    print(f"\n(took {time.monotonic() - started:.0f}s)")


if __name__ == "__main__":
    main()

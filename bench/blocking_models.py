"""Blocking user code on a worker: turns per second when the model is a *sync* function
that sleeps 500 ms, on one worker process with ``CONVOQ_CONCURRENCY=100``.

Three profiles, measured in the same run on the same worker:

- ``sync``: the sync function as users write it; convoq runs it on its pool for blocking
  code, sized to the worker's concurrency;
- ``to_thread``: the same function through ``asyncio.to_thread``, i.e. asyncio's default
  executor (``min(32, CPUs + 4)`` threads), which is where convoq used to run it;
- ``async``: an async model awaiting ``asyncio.sleep(0.5)``, the reference.

Ideal: 2 turns/s per slot, 200 turns/s with 100 conversations. Run ``python -m bench
blocking`` (or ``python -m bench.blocking_models``). This module is also the profile module
of the worker it starts (``CONVOQ_AGENTS=bench.blocking_models``).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

from convoq import Agent
from convoq.client import AsyncClient, Client
from convoq.models import ModelRequest, ScriptedModel
from convoq.worker._spawn import worker_process

ROOT = Path(__file__).resolve().parents[1]
CONCURRENCY = 100
CONVERSATIONS = 100
TURNS_EACH = 4


# -- what the worker process loads -----------------------------------------------------------
def _blocking_half_second(_request: ModelRequest) -> str:
    time.sleep(0.5)
    return "ok"


async def _via_default_executor(request: ModelRequest) -> str:
    return await asyncio.to_thread(_blocking_half_second, request)


async def _async_half_second(_request: ModelRequest) -> str:
    await asyncio.sleep(0.5)
    return "ok"


sync = Agent(ScriptedModel(_blocking_half_second), name="sync")
to_thread = Agent(ScriptedModel(_via_default_executor), name="to_thread")
async_ = Agent(ScriptedModel(_async_half_second), name="async")


# -- the run ---------------------------------------------------------------------------------
async def _rate(client: AsyncClient, agent: str) -> float:
    async def one(cid: str) -> list[object]:
        return [await client.submit(cid, f"turn {i}", agent=agent) for i in range(TURNS_EACH)]

    started = time.perf_counter()
    run = uuid.uuid4().hex[:6]
    groups = await asyncio.gather(*(one(f"{agent}-{run}-{n}") for n in range(CONVERSATIONS)))
    handles = [h for group in groups for h in group]
    await asyncio.gather(*(h.wait(300) for h in handles))  # type: ignore[attr-defined]
    return len(handles) / (time.perf_counter() - started)


async def _rates(url: str, prefix: str) -> dict[str, float]:
    async with AsyncClient(url, prefix=prefix) as client:
        # Untimed warm-up: the worker's connections and the pool's threads get started.
        await _rate(client, "sync")
        return {agent: await _rate(client, agent) for agent in ("sync", "to_thread", "async")}


def run() -> str:
    from convoq.redis import embedded

    with tempfile.TemporaryDirectory(prefix="convoq-bench-") as tmp, ExitStack() as stack:
        home = Path(tmp)
        url = embedded.embedded_url(home)
        stack.callback(embedded.stop, home)
        prefix = f"bench{uuid.uuid4().hex[:6]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOQ_")}
        env.update(
            CONVOQ_REDIS_URL=url,
            CONVOQ_PREFIX=prefix,
            CONVOQ_HOME=str(home),
            CONVOQ_AGENTS="bench.blocking_models",
            CONVOQ_CONCURRENCY=str(CONCURRENCY),
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        )
        client = stack.enter_context(Client(url, prefix=prefix))
        name = f"bench-{uuid.uuid4().hex[:6]}@localhost"
        log = home / "worker.log"
        options = ("--loglevel=warning",)
        worker = worker_process(name, env, log, *options, registered=client.workers, cwd=ROOT)
        stack.enter_context(worker)
        rates = asyncio.run(_rates(url, prefix))
    ideal = 2 * min(CONVERSATIONS, CONCURRENCY)
    lines = [
        f"one worker process, CONVOQ_CONCURRENCY={CONCURRENCY}; {CONVERSATIONS} conversations"
        f" x {TURNS_EACH} turns; model takes 500 ms; ideal {ideal} turns/s",
        f"{'model':<50}{'turns/s':>9}{'of ideal':>10}",
    ]
    labels = {
        "sync": "sync function (convoq's pool for blocking code)",
        "to_thread": "same via asyncio.to_thread (default executor)",
        "async": "async function (reference)",
    }
    for agent, label in labels.items():
        lines.append(f"{label:<50}{rates[agent]:>9.1f}{rates[agent] / ideal:>10.0%}")
    return "\n".join(lines)


def main() -> None:
    started = time.perf_counter()
    print(run())
    print(f"(took {time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()

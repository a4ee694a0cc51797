"""Turns per second of convoq workers as concurrent conversations grow, with a model that
sleeps 500 ms per call (1, 10, 100 conversations of 4 queued turns on one worker process,
then 100 and 200 on two), on a private redis-server.

The submit-to-result time of one turn against bare Celery and the hand-built task is a
row of ``python -m bench compare`` (each system on its own server, alternating rounds).

Run ``python -m bench turns``.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

from bench._harness import redis_server
from bench.compare import start_convoq_worker, worker_env
from convoq.client import AsyncClient, Client

WORKER_CONCURRENCY = 100


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


def run() -> None:
    """Start a server and the workers, measure, print."""
    with tempfile.TemporaryDirectory(prefix="convoq-bench-") as tmp, ExitStack() as stack:
        home = Path(tmp)
        url = stack.enter_context(redis_server(home / "redis"))
        prefix = f"bench{uuid.uuid4().hex[:6]}"
        env = worker_env(url, prefix, home, WORKER_CONCURRENCY)
        client = stack.enter_context(Client(url, prefix=prefix))
        start_convoq_worker(stack, env, home, client)
        shapes = [(1, 4), (10, 4), (100, 4)]
        one = asyncio.run(_throughputs(url, prefix, shapes))
        start_convoq_worker(stack, env, home, client)
        two = asyncio.run(_throughputs(url, prefix, [(100, 4), (200, 4)]))
    print(f"worker threads pool, concurrency {WORKER_CONCURRENCY}")
    print("throughput, model sleeping 500 ms per call (4 queued turns per conversation)")
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

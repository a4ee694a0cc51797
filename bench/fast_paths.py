"""What the fast paths save: the same calls with ``CONVOQ_FAST_PATHS`` on and off, side
by side in one process on one Redis, in interleaved rounds (load on the machine hits both
columns alike).

- ``append`` / ``load-10``: ``RedisConversationMemory`` calls, async (a client in the
  caller's loop) and sync (I/O on the caller's thread): the direct RESP path against
  redis-py's ``Script`` and pipeline;
- ``submit``: ``AsyncClient.submit`` of a turn to an idle conversation (no worker runs:
  the kick stays queued): the kick pushed by the ``submit`` script against ``send_task``;
- the cost of the direct sender's own metric (one histogram observation per call).

The worker's own line is measured by ``python -m bench fair`` (run it with
``CONVOQ_FAST_PATHS=off`` for the broker's way). Run ``python -m bench fastpaths``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import timeit
import uuid
from collections.abc import Awaitable, Callable

from bench._harness import embedded_redis, fast_paths_mode, print_run
from bench.memory_append import a_turn
from convoq.client import AsyncClient
from convoq.memory.redis import RedisConversationMemory
from convoq.observe import metrics
from convoq.redis import connect
from convoq.settings import ConvoqSettings

ROUNDS = 7
PER_ROUND = 100
WINDOW = 10
MODES = ("on", "off")


async def _timed(samples: list[float], call: Callable[[], Awaitable[object]]) -> None:
    for _ in range(PER_ROUND):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)


async def _run(url: str) -> str:
    times: dict[tuple[str, str], list[float]] = {}
    async_memories, sync_memories, clients = {}, {}, {}
    for mode in MODES:
        fast_paths_mode(mode)
        async_memories[mode] = RedisConversationMemory(client=connect(url), prefix=f"b-{mode}")
        sync_memories[mode] = RedisConversationMemory(url, prefix=f"bs-{mode}")
        settings = ConvoqSettings.resolve(redis_url=url, prefix=f"bc-{mode}", partitions=4)
        clients[mode] = await AsyncClient(settings=settings).connect()
    try:
        for n in range(ROUNDS):
            for mode in MODES:
                fast_paths_mode(mode)  # the sync memory builds its sync client on first use
                await _round(
                    n, mode, async_memories[mode], sync_memories[mode], clients[mode], times
                )
    finally:
        fast_paths_mode(None)
        for mode in MODES:
            await async_memories[mode].aclose()
            await asyncio.to_thread(sync_memories[mode].close)
            await clients[mode].aclose()
    return _table(times)


async def _round(
    n: int,
    mode: str,
    memory: RedisConversationMemory,
    sync_memory: RedisConversationMemory,
    client: AsyncClient,
    times: dict[tuple[str, str], list[float]],
) -> None:
    cid = f"c{n}"
    counter = iter(range(10**9))
    await _timed(times.setdefault(("append", mode), []),
                 lambda: memory.aappend(cid, a_turn(next(counter))))  # fmt: skip
    await _timed(times.setdefault(("load-10", mode), []),
                 lambda: memory.aload(cid, last_turns=WINDOW))  # fmt: skip

    async def sync_append() -> None:
        sync_memory.append(cid, a_turn(next(counter)))

    async def sync_load() -> None:
        sync_memory.load(cid, last_turns=WINDOW)

    await _timed(times.setdefault(("sync append", mode), []), sync_append)
    await _timed(times.setdefault(("sync load-10", mode), []), sync_load)

    async def submit() -> None:  # a new, idle conversation each time: a kick each time
        await client.submit(uuid.uuid4().hex, "hello", agent="bench")

    await _timed(times.setdefault(("submit", mode), []), submit)


def _table(times: dict[tuple[str, str], list[float]]) -> str:
    lines = [
        f"medians of {ROUNDS * PER_ROUND} calls per cell, modes alternating round by round",
        f"{'call':<14}{'on µs':>9}{'off µs':>9}{'off-on':>9}{'off/on':>8}",
    ]
    for op in ("append", "load-10", "sync append", "sync load-10", "submit"):
        on = statistics.median(times[(op, "on")]) * 1e6
        off = statistics.median(times[(op, "off")]) * 1e6
        lines.append(f"{op:<14}{on:>9.0f}{off:>9.0f}{off - on:>+9.0f}{off / on:>8.2f}")
    per_call = timeit.timeit(lambda: metrics.redis_direct_call("read", 0.0002), number=100_000)
    lines.append(f"the direct sender's metric: {per_call * 10:.2f} µs per call")
    return "\n".join(lines)


async def run() -> str:
    with embedded_redis("convoq-bench-fast-") as (_work, url):
        return await _run(url)


def main() -> None:
    print_run(run)


if __name__ == "__main__":
    main()

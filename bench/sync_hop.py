"""What a sync memory call costs over the same async call: ``RedisConversationMemory(url)``'s
``append`` and ``load(last_turns=10)``, three ways, in the same run on one Redis.

- async: ``await memory.aappend(...)`` with a client in the caller's own event loop (the
  cheapest a caller can get; what the sync call is compared with);
- sync: ``memory.append(...)`` from plain sync code (I/O on the caller's thread);
- bridge hop: the coroutine run on convoq's bridge loop thread from sync code, which is
  how sync calls used to work (``run_sync(memory.aappend(...))``).

Each cell is the median of all samples; samples are taken in interleaved rounds so load on
the machine hits every column alike. The bar: sync minus async at most 50 µs per call.

Run ``python -m bench hop`` (or ``python -m bench.sync_hop``).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.memory_append import a_turn
from convoq._sync import run_sync
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import Message
from convoq.redis import connect, embedded

ROUNDS = 7
PER_ROUND = 150
WINDOW = 10
HISTORY = 50
BAR_US = 50.0


class Sampler:
    """Times single calls of each flavour into a list of seconds per (operation, flavour)."""

    def __init__(self, url: str, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.times: dict[tuple[str, str], list[float]] = {}
        self.owned = RedisConversationMemory(url, prefix="bench-hop")
        self.in_loop = loop.run_until_complete(self._in_loop_memory(url))
        self.counter = 0

    async def _in_loop_memory(self, url: str) -> RedisConversationMemory:
        return RedisConversationMemory(client=connect(url), prefix="bench-hop")

    def _turn(self) -> list[Message]:
        self.counter += 1
        return a_turn(self.counter)

    def _record(self, op: str, flavour: str, seconds: float) -> None:
        self.times.setdefault((op, flavour), []).append(seconds)

    def round(self, cid: str) -> None:
        for _ in range(PER_ROUND):
            turn = self._turn()
            start = time.perf_counter()
            self.owned.append(cid, turn)
            self._record("append", "sync", time.perf_counter() - start)
            start = time.perf_counter()
            self.owned.load(cid, last_turns=WINDOW)
            self._record("load-10", "sync", time.perf_counter() - start)
        for _ in range(PER_ROUND):
            turn = self._turn()
            start = time.perf_counter()
            run_sync(self.owned.aappend(cid, turn))
            self._record("append", "bridge hop", time.perf_counter() - start)
            start = time.perf_counter()
            run_sync(self.owned.aload(cid, last_turns=WINDOW))
            self._record("load-10", "bridge hop", time.perf_counter() - start)
        self.loop.run_until_complete(self._async_round(cid))

    async def _async_round(self, cid: str) -> None:
        memory = self.in_loop
        for _ in range(PER_ROUND):
            turn = self._turn()
            await self._timed("append", lambda t=turn: memory.aappend(cid, t))
            await self._timed("load-10", lambda: memory.aload(cid, last_turns=WINDOW))

    async def _timed(self, op: str, call: Callable[[], Awaitable[object]]) -> None:
        start = time.perf_counter()
        await call()
        self._record(op, "async", time.perf_counter() - start)

    def close(self) -> None:
        self.owned.close()
        self.loop.run_until_complete(self.in_loop.aclose())


def _us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def _table(medians: dict[tuple[str, str], float]) -> str:
    lines = [
        f"{'call':<9}{'async µs':>10}{'sync µs':>10}{'sync-async':>12}{'bridge hop µs':>15}"
        f"{'hop-async':>11}{'  sync ≤ async+50µs':>20}"
    ]
    for op in ("append", "load-10"):
        a, s, h = (medians[(op, f)] for f in ("async", "sync", "bridge hop"))
        verdict = "yes" if s - a <= BAR_US else "NO"
        lines.append(
            f"{op:<9}{a:>10.0f}{s:>10.0f}{s - a:>+12.0f}{h:>15.0f}{h - a:>+11.0f}{verdict:>20}"
        )
    return "\n".join(lines)


def measure(url: str, rounds: int = ROUNDS, history: int = HISTORY) -> dict[tuple[str, str], float]:
    """Median µs per call of each (operation, flavour) against the Redis at ``url``."""
    loop = asyncio.new_event_loop()
    sampler = Sampler(url, loop)
    try:
        cid = f"hop-{uuid.uuid4().hex[:8]}"
        for n in range(history):
            sampler.owned.append(cid, a_turn(-n))
        for _ in range(rounds):
            sampler.round(cid)
        sampler.owned.clear(cid)
        return {key: _us(samples) for key, samples in sampler.times.items()}
    finally:
        sampler.close()
        loop.close()


def run() -> str:
    work = Path(tempfile.mkdtemp(prefix="convoq-bench-hop-"))
    home = work / "redis"
    url = embedded.embedded_url(home)
    try:
        medians = measure(url)
        head = (
            f"embedded redis-server (unix socket); one turn = user ~200 chars + assistant ~600"
            f" chars; {HISTORY}+ turns stored; medians of {ROUNDS * PER_ROUND} calls per cell,"
            " interleaved rounds"
        )
        return head + "\n" + _table(medians)
    finally:
        embedded.stop(home)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    started = time.perf_counter()
    print(run())
    print(f"(took {time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()

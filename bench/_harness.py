"""What the in-process benchmarks share: a private embedded redis-server in a temporary
directory, timing an awaited call, and printing a run with how long it took."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

from convoq.redis import embedded


@contextlib.contextmanager
def embedded_redis(prefix: str = "convoq-bench-") -> Iterator[tuple[Path, str]]:
    """``(work directory, Redis URL)`` of an embedded server started for the benchmark;
    stopped and removed afterwards."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    home = work / "redis"
    try:
        yield work, embedded.embedded_url(home)
    finally:
        embedded.stop(home)
        shutil.rmtree(work, ignore_errors=True)


async def timings_ms(samples: int, call: Callable[[int], Awaitable[object]]) -> list[float]:
    """Milliseconds each of ``samples`` awaited calls took (``call`` gets the sample's index)."""
    times = []
    for n in range(samples):
        start = time.perf_counter()
        await call(n)
        times.append((time.perf_counter() - start) * 1000)
    return times


def print_run(run: Callable[[], Coroutine[Any, Any, str]]) -> None:
    """Run ``run`` on a fresh event loop, print its report and how long it took."""
    started = time.perf_counter()
    print(asyncio.run(run()))
    print(f"(took {time.perf_counter() - started:.1f} s)")

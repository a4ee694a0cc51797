"""What the benchmarks share: private redis-servers configured alike, the machine's load,
timing in rounds that alternate the systems compared, per-round ratios, and printing a run
with how long it took."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import redis

from convoq._ports import free_loopback_port
from convoq.redis import embedded

# Every private server the benchmarks start runs with these, whatever system it serves.
PERSISTENCE = ("--appendonly", "yes", "--appendfsync", "everysec", "--save", "")
PERSISTENCE_TEXT = "AOF on, appendfsync everysec, no RDB snapshots"


def quick() -> bool:
    """Fewer rounds and samples, for iterating (``BENCH_QUICK=1`` or ``--quick``)."""
    return os.environ.get("BENCH_QUICK", "") not in ("", "0")


def for_rounds(full: int, fast: int) -> int:
    """``full``, or ``fast`` in the quick mode."""
    return fast if quick() else full


def fast_paths_mode(mode: str | None) -> None:
    """``CONVOQ_FAST_PATHS`` of this process for what is built or first used next (``on``,
    ``off``; None: unset, the default). For in-process comparisons of the two modes."""
    if mode is None:
        os.environ.pop("CONVOQ_FAST_PATHS", None)
    else:
        os.environ["CONVOQ_FAST_PATHS"] = mode


def load_line(stage: str) -> str:
    """The machine's load average (1/5/15 min) at ``stage``, with a warning at the start
    when it is 1 or more (other work shares the cores the figures come from)."""
    one, five, fifteen = os.getloadavg()
    line = f"[{stage}] load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"
    if stage == "start" and one >= 1:
        line += "  WARNING: load >= 1 at the start; other work shares these cores"
    return line


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[str]:
    """A private redis-server (``PERSISTENCE``) on a free local port, its data in
    ``directory``; its URL. Without a ``redis-server`` binary: convoq's embedded server."""
    directory.mkdir(parents=True, exist_ok=True)
    binary = shutil.which("redis-server")
    if binary is None:
        url = embedded.embedded_url(directory)
        try:
            yield url
        finally:
            embedded.stop(directory)
        return
    port = free_loopback_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
               *PERSISTENCE]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    try:
        for _ in range(250):
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


def rotated(items: Sequence[Any], round_number: int) -> list[Any]:
    """``items`` starting at a different one each round, so no system always goes first."""
    k = round_number % len(items) if items else 0
    return [*items[k:], *items[:k]]


async def alternating_ms(
    rounds: int, per_round: int, calls: dict[str, Callable[[], Awaitable[object]]]
) -> dict[str, list[float]]:
    """Per system, the median ms of its ``per_round`` calls in each of ``rounds`` rounds;
    within a round the systems take turns (the first one rotates), so each meets the
    machine's and the servers' conditions as often as the others."""
    medians: dict[str, list[float]] = {name: [] for name in calls}
    for n in range(rounds):
        for name in rotated(list(calls), n):
            times = await timings_ms(per_round, lambda _i, c=calls[name]: c())
            medians[name].append(statistics.median(times))
    return medians


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Round by round ``a / b``: the two were measured in the same rounds."""
    return [x / y for x, y in zip(a, b, strict=True)]


def spread(values: Sequence[float], digits: int = 2) -> str:
    """``median [min-max]``."""
    return (
        f"{statistics.median(values):.{digits}f}"
        f" [{min(values):.{digits}f}-{max(values):.{digits}f}]"
    )


def print_run(run: Callable[[], Coroutine[Any, Any, str]]) -> None:
    """Run ``run`` on a fresh event loop, print its report and how long it took."""
    started = time.perf_counter()
    print(asyncio.run(run()))
    print(f"(took {time.perf_counter() - started:.1f} s)")

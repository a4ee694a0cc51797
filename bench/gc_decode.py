"""The cyclic garbage collector and long history loads, with the collector left on (convoq
never switches it off): decoding each time, the turns a process keeps decoded, and
``gc.freeze()`` as a worker does at start.

A whole-history load of 10,000 turns decodes to some 100,000 tracked objects; each burst
of allocations triggers collections, and a full collection walks every tracked object of
the process: in a worker, Celery's, kombu's and convoq's own by the hundred thousand. For
a process as bare as the benchmark's and for one holding a worker's heap (the worker app
built and its modules imported, a worker's worth of extra objects), it prints the median
of a full load with:

- ``decoded``: every load decodes (``CONVOQ_DECODED_CACHE_BYTES=0``);
- ``first``: the process keeps decoded turns (the default) and reads these the first
  time: it decodes them and keeps them;
- ``kept``: the same turns read again: the load allocates no message at all;
- ``frozen``: as ``decoded``, after ``gc.freeze()`` of everything alive (what a worker
  freezing its heap at start gets: the objects alive then are left out of every later
  collection).

Then how long one full collection takes with the worker's heap, and with it frozen (the
worker freezes its heap at start: :meth:`convoq.worker.runtime.WorkerRuntime.announce`).

Redis is a private embedded redis-server. Run ``python -m bench gc``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import time
from collections.abc import Iterator

from bench._harness import embedded_redis, print_run
from bench.memory_window import _populate
from convoq.memory.redis import RedisConversationMemory
from convoq.redis import _decoded

TURNS = 10_000
ROUNDS = 9
# Objects a busy worker holds beyond its modules (turn records, connections, buffers...):
# a few hundred thousand small containers, all tracked by the collector.
WORKER_EXTRA = 300_000


MODES = ("decoded", "first", "kept", "frozen")


@contextlib.contextmanager
def _mode(name: str) -> Iterator[None]:
    """See the module docstring (the collector on in every mode)."""
    keeps = name in ("first", "kept")
    os.environ["CONVOQ_DECODED_CACHE_BYTES"] = str(512 * 1024**2) if keeps else "0"
    _decoded.reset()
    if name == "frozen":
        gc.collect()
        gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        os.environ.pop("CONVOQ_DECODED_CACHE_BYTES", None)


async def _medians(memory: RedisConversationMemory, cid: str) -> dict[str, float]:
    """Median ms per mode, the modes alternating round by round."""
    times: dict[str, list[float]] = {name: [] for name in MODES}
    for _ in range(ROUNDS):
        for name, samples in times.items():
            with _mode(name):
                if name == "kept":
                    await memory.aload(cid)  # the read before, untimed
                started = time.perf_counter()
                loaded = await memory.aload(cid)
                samples.append((time.perf_counter() - started) * 1000)
                assert len(loaded) == 2 * TURNS + 1
                del loaded
                _decoded.reset()
                gc.collect()
    return {name: statistics.median(samples) for name, samples in times.items()}


def _worker_heap() -> list[object]:
    """What a worker process holds: its app and modules, plus extra live objects."""
    from convoq.settings import ConvoqSettings
    from convoq.worker.app import create_app

    app = create_app(ConvoqSettings(redis_url="redis://127.0.0.1:1/0"))
    import celery.worker.consumer  # noqa: F401  (what a running worker has imported)

    return [app, [{"n": n, "s": [n]} for n in range(WORKER_EXTRA)]]


async def run() -> str:
    with embedded_redis("convoq-bench-gc-") as (_work, url):
        memory = RedisConversationMemory(url, prefix="bench")
        try:
            cid = f"gc-{TURNS}"
            await _populate(memory, cid, TURNS)
            lines = [f"full load of {TURNS:,} turns, median ms of {ROUNDS} (modes alternating)"]
            lines.append(f"{'process':<34}{'tracked':>10}" + "".join(f"{m:>9}" for m in MODES))
            bare = await _medians(memory, cid)
            lines.append(_line("bare (benchmark process)", bare))
            heap = _worker_heap()
            worker = await _medians(memory, cid)
            lines.append(_line("with a worker's heap", worker))
            lines.append(_full_collections())
            del heap
            return "\n".join(lines)
        finally:
            await memory.aclose()


def _full_collections() -> str:
    """How long one full collection stalls the process, as is and with the heap frozen
    (what every thread of a worker waits for, decode or not)."""

    def median_ms() -> float:
        times = []
        for _ in range(5):
            started = time.perf_counter()
            gc.collect()
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)

    before = median_ms()
    gc.freeze()
    try:
        frozen = median_ms()
    finally:
        gc.unfreeze()
    return f"one full collection with a worker's heap: {before:.1f} ms; frozen: {frozen:.2f} ms"


def _line(what: str, medians: dict[str, float]) -> str:
    tracked = len(gc.get_objects())
    values = "".join(f"{medians[name]:>9.1f}" for name in MODES)
    return f"{what:<34}{tracked:>10,}{values}"


def main() -> None:
    print_run(run)


if __name__ == "__main__":
    main()

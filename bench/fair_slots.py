"""Fair slots on their own: one convoq worker process with 32 slots, the async 500 ms
model (``bench.compare``'s ``slow`` agent), on a private redis-server.

- burst: 100 conversations x 4 turns submitted at once by an AsyncClient; the slot cap is
  32 slots / 0.5 s = 64 turns/s (the bar: >= 0.9 of it).
- lone: 1 conversation x 8 turns; one round trip per turn keeps it at ~2 turns/s.
- pair: the burst again on two worker processes of 16 slots each (the same cap): a worker
  holds the kicks waiting for its slots, so this shows what that costs when a peer could
  have taken them.

Each run also reads every burst turn's record (``started_ms``, ``finished_ms``, Redis
clock) to show where the time above the ideal goes: before the first turn starts, while
slots sit idle between turns (slot-seconds not spent in a turn, per turn), and after the
last turn ends until the last wait returns.

Run ``python -m bench fair`` (``BENCH_RUNS``: runs, default 5).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import redis

from bench._harness import redis_server
from bench.compare import start_convoq_worker, worker_env
from convoq import AsyncClient, Client

SLOTS = 32
MODEL_S = 0.5


@dataclass
class Burst:
    """One timed burst and what its turn records say."""

    turns_per_s: float
    wall_s: float
    to_first_start_s: float
    idle_per_turn_s: float
    run_s: float
    after_last_s: float


async def _burst(url: str, prefix: str, conversations: int, turns: int) -> Burst:
    async with AsyncClient(url, prefix=prefix) as client:

        async def one(cid: str) -> list[object]:
            return [await client.submit(cid, f"turn {i}", agent="slow") for i in range(turns)]

        started, wall0 = time.perf_counter(), time.time()
        groups = await asyncio.gather(
            *(one(f"f-{uuid.uuid4().hex[:10]}") for _ in range(conversations))
        )
        handles = [h for group in groups for h in group]
        results = await asyncio.gather(*(h.wait(300) for h in handles))  # type: ignore[attr-defined]
        wall = time.perf_counter() - started
        ended = time.time()
    if not all(r.ok for r in results):
        raise RuntimeError(f"{sum(not r.ok for r in results)} turns did not succeed")
    spans = _spans(url, prefix, handles)
    first, last = min(s for s, _ in spans), max(f for _, f in spans)
    busy = sum(f - s for s, f in spans)
    slots = min(SLOTS, conversations)
    return Burst(
        turns_per_s=len(handles) / wall,
        wall_s=wall,
        to_first_start_s=first - wall0,
        idle_per_turn_s=(slots * (last - first) - busy) / len(handles),
        run_s=statistics.median(f - s for s, f in spans),
        after_last_s=ended - last,
    )


def _spans(url: str, prefix: str, handles: list[object]) -> list[tuple[float, float]]:
    from convoq.redis.keys import KeySchema

    keys = KeySchema(prefix)
    r = redis.Redis.from_url(url)
    pipe = r.pipeline(transaction=False)
    for h in handles:
        pipe.hmget(keys.turn(h.conversation_id, h.turn_id), "started_ms", "finished_ms")  # type: ignore[attr-defined]
    rows = pipe.execute()
    r.close()
    return [(int(s) / 1000, int(f) / 1000) for s, f in rows]


def _shown(values: list[float], unit: str = "") -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]{unit}"


def main() -> None:
    runs = int(os.environ.get("BENCH_RUNS", "5"))
    bursts: list[Burst] = []
    lone: list[float] = []
    pair: list[float] = []
    with tempfile.TemporaryDirectory(prefix="convoq-bench-fair-") as tmp:
        home = Path(tmp)
        (home / "redis").mkdir()
        with redis_server(home / "redis") as url, ExitStack() as stack:
            prefix, paired = f"f{uuid.uuid4().hex[:6]}", f"p{uuid.uuid4().hex[:6]}"
            with Client(url, prefix=prefix) as client, Client(url, prefix=paired) as other:
                start_convoq_worker(stack, worker_env(url, prefix, home, SLOTS), home, client)
                for _ in range(2):
                    env = worker_env(url, paired, home, SLOTS // 2)
                    start_convoq_worker(stack, env, home, other)
            # Untimed: the pool's threads and connections exist before anything is timed.
            asyncio.run(_burst(url, prefix, SLOTS, 1))
            asyncio.run(_burst(url, paired, SLOTS, 1))
            for run in range(runs):
                burst = asyncio.run(_burst(url, prefix, 100, 4))
                alone = asyncio.run(_burst(url, prefix, 1, 8)).turns_per_s
                two = asyncio.run(_burst(url, paired, 100, 4)).turns_per_s
                bursts.append(burst)
                lone.append(alone)
                pair.append(two)
                print(
                    f"run {run + 1}/{runs}: burst {burst.turns_per_s:.1f}/s"
                    f" (wall {burst.wall_s:.2f}s, first start {burst.to_first_start_s:.3f}s,"
                    f" idle slot time per turn {burst.idle_per_turn_s:.3f}s, turn"
                    f" {burst.run_s:.3f}s, after last {burst.after_last_s:.3f}s);"
                    f" lone {alone:.2f}/s; two processes {two:.1f}/s",
                    flush=True,
                )
    cap = SLOTS / MODEL_S
    rate = statistics.median(b.turns_per_s for b in bursts)
    print(f"burst 100 conv x 4 turns, {SLOTS} slots: {_shown([b.turns_per_s for b in bursts])}/s")
    print(f"  = {rate / cap:.2f} of the {cap:.0f}/s cap (bar >= 0.9)")
    print(f"  idle slot time per turn: {_shown([b.idle_per_turn_s for b in bursts], ' s')}")
    print(f"  first turn started after: {_shown([b.to_first_start_s for b in bursts], ' s')}")
    print(f"  last wait returned after the last turn: {_shown([b.after_last_s for b in bursts])}")
    print(f"lone conversation x 8 turns: {_shown(lone)}/s (one round trip per turn: ~2/s)")
    print(f"burst on two processes x {SLOTS // 2} slots: {_shown(pair)}/s")


if __name__ == "__main__":
    main()

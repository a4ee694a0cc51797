"""Where one plain turn's cost goes: Redis commands per turn by command name (scripts'
inner calls included, ``INFO commandstats``), ``submit()`` client CPU, and the zero-model
submit->result time, on a private redis-server with one convoq worker.

Run ``python -m bench cost``; narrower and quicker than ``python -m bench compare``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import redis

from bench.compare import redis_server, start_convoq_worker, worker_env
from convoq.client import Client

TURNS = 50


def _calls(r: redis.Redis) -> Counter[str]:
    stats = r.info("commandstats")
    return Counter(
        {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if "calls" in v}
    )


def _per_turn(r: redis.Redis, client: Client) -> Counter[str]:
    r.config_resetstat()
    time.sleep(1.0)
    idle = _calls(r)  # pollers and the sweeper, per second
    r.config_resetstat()
    started = time.perf_counter()
    for _ in range(TURNS):
        client.submit(f"cmd-{uuid.uuid4().hex[:10]}", "hi", agent="zero").wait(30)
    elapsed = time.perf_counter() - started
    busy = _calls(r)
    busy.subtract({k: round(v * elapsed) for k, v in idle.items()})
    return Counter({k: round(v / TURNS, 1) for k, v in busy.items() if v > 0})


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="convoq-cost-") as tmp, ExitStack() as stack:
        home = Path(tmp)
        (home / "redis").mkdir()
        url = stack.enter_context(redis_server(home / "redis"))
        prefix = f"c{uuid.uuid4().hex[:6]}"
        client = stack.enter_context(Client(url, prefix=prefix))
        start_convoq_worker(stack, worker_env(url, prefix, home, 8), home, client)
        r = redis.Redis.from_url(url)
        for _ in range(20):
            client.submit(f"warm-{uuid.uuid4().hex[:10]}", "hi", agent="zero").wait(30)
        for run in range(3):
            per = _per_turn(r, client)
            shown = ", ".join(f"{k} {v:g}" for k, v in per.most_common() if v >= 0.5)
            print(f"run {run + 1}: {sum(per.values()):.1f} commands per turn: {shown}")
            cpu = time.process_time()
            handles = [client.submit(f"cpu-{uuid.uuid4().hex[:10]}", "hi", agent="zero")
                       for _ in range(200)]  # fmt: skip
            print(f"  submit() client CPU {(time.process_time() - cpu) / 200 * 1000:.3f} ms")
            for handle in handles:
                handle.wait(60)
            samples = []
            for _ in range(100):
                start = time.perf_counter()
                client.submit(f"lat-{uuid.uuid4().hex[:10]}", "hi", agent="zero").wait(30)
                samples.append(time.perf_counter() - start)
            print(f"  submit->result {statistics.median(samples) * 1000:.2f} ms")
        r.close()


if __name__ == "__main__":
    main()

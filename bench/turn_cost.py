"""Where one plain turn's cost goes: Redis commands per turn by command name (scripts'
inner calls included, ``INFO commandstats``), ``submit()`` client CPU, and the zero-model
submit->result time, on a private redis-server with one convoq worker; then, in a last
pass of its own (every command logged, which slows Redis a little), the Redis time of each
script call and what the server spent per turn in all (``SLOWLOG``).

Run ``python -m bench cost``; narrower and quicker than ``python -m bench compare``.
"""

from __future__ import annotations

import hashlib
import statistics
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import redis

from bench._harness import redis_server
from bench.compare import start_convoq_worker, worker_env
from convoq.client import Client
from convoq.redis.scripts import NAMES, source

TURNS = 50


def _calls(r: redis.Redis) -> Counter[str]:
    stats = r.info("commandstats")
    return Counter(
        {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if "calls" in v}
    )


def commands_per_turn(r: redis.Redis, turn: Callable[[], None], turns: int) -> Counter[str]:
    """Commands per ``turn()`` by name on the server of ``r``, less what its idle clients
    (pollers, the sweeper) sent in as long, measured over one second just before."""
    r.config_resetstat()
    idle_started = time.perf_counter()
    time.sleep(1.0)
    idle = _calls(r)
    idle_seconds = time.perf_counter() - idle_started
    r.config_resetstat()
    started = time.perf_counter()
    for _ in range(turns):
        turn()
    elapsed = time.perf_counter() - started
    busy = _calls(r)
    busy.subtract({k: v * elapsed / idle_seconds for k, v in idle.items()})
    return Counter({k: v / turns for k, v in busy.items() if v > 0 and k not in _OWN})


# This measurement's own commands.
_OWN = ("info", "config|resetstat", "config")


def _plain_turn(client: Client, tag: str) -> None:
    client.submit(f"{tag}-{uuid.uuid4().hex[:10]}", "hi", agent="zero").wait(30)


def _script_time(r: redis.Redis, client: Client) -> None:
    """Median server time of each script call, and the server's time per turn in all."""
    names = {hashlib.sha1(source(n).encode()).hexdigest(): n for n in NAMES}
    r.config_set("slowlog-max-len", 100_000)
    r.config_set("slowlog-log-slower-than", 0)
    r.slowlog_reset()
    try:
        for _ in range(TURNS):
            client.submit(f"slow-{uuid.uuid4().hex[:10]}", "hi", agent="zero").wait(30)
        entries = r.slowlog_get(100_000)
    finally:
        r.config_set("slowlog-log-slower-than", 10_000)
    scripts: dict[str, list[int]] = {}
    total = 0
    for entry in entries:
        words = [w.decode() if isinstance(w, bytes) else w for w in entry["command"].split()]
        if words and words[0].upper() in ("SLOWLOG", "CONFIG"):
            continue  # this measurement's own
        if not str(entry.get("client_address", b"")).startswith(("b'?", "?")):
            total += int(entry["duration"])  # a script's own calls are in its time already
        if words and words[0].upper() == "EVALSHA" and len(words) > 1:
            scripts.setdefault(names.get(words[1], words[1][:8]), []).append(entry["duration"])
    shown = ", ".join(f"{n} {statistics.median(d):g}" for n, d in sorted(scripts.items()))
    print(f"script call medians (µs, Redis time): {shown}")
    print(f"Redis time per turn, all clients' commands (pollers too): {total / TURNS:.0f} µs")


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
            per = commands_per_turn(r, lambda: _plain_turn(client, "cmd"), TURNS)
            shown = ", ".join(f"{k} {v:.1f}" for k, v in per.most_common() if v >= 0.5)
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
        _script_time(r, client)
        r.close()


if __name__ == "__main__":
    main()

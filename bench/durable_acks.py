"""What ``min_replicas_acked`` costs: submit-to-result latency of sequential turns (zero
latency model, one worker process) on a primary with one replica, with the setting off
(0) and on (1: submit, commit and the client's wait each end with ``WAIT 1``), and the
turns per second of 200 conversations at once.

``python -m bench.durable_acks`` (part of ``make bench``). The servers are local
redis-servers (AOF, ``appendfsync always``) with loopback replication: a replica across
a network adds its round trip to each acknowledged write.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

from convoq.client import AsyncClient, Client
from convoq.worker._spawn import worker_process

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 100
BURST = 200


def _env(url: str, broker: str, prefix: str, home: Path, replicas: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOQ_")}
    env.update(
        CONVOQ_REDIS_URL=url,
        CONVOQ_BROKER_URL=broker,
        CONVOQ_PREFIX=prefix,
        CONVOQ_HOME=str(home),
        CONVOQ_AGENTS="bench.scaling",
        CONVOQ_CONCURRENCY="100",
        CONVOQ_TASK_EVENTS="false",
        CONVOQ_MIN_REPLICAS_ACKED=str(replicas),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    return env


async def _latencies(client: AsyncClient, rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        handle = await client.submit(f"lat-{uuid.uuid4().hex[:10]}", "hi", agent="zero")
        await handle.wait(30)
        samples.append(time.perf_counter() - started)
    return samples


async def _burst(client: AsyncClient) -> float:
    started = time.perf_counter()
    handles = await asyncio.gather(
        *(client.submit(f"b-{uuid.uuid4().hex[:10]}", "hi", agent="zero") for _ in range(BURST))
    )
    await asyncio.gather(*(h.wait(120) for h in handles))
    return BURST / (time.perf_counter() - started)


def _case(url: str, broker: str, home: Path, replicas: int) -> tuple[list[float], float]:
    prefix = f"acks{uuid.uuid4().hex[:6]}"
    env = _env(url, broker, prefix, home, replicas)
    with ExitStack() as stack:
        client = stack.enter_context(Client(url, broker_url=broker, prefix=prefix))
        name = f"acks-{uuid.uuid4().hex[:6]}@localhost"
        stack.enter_context(
            worker_process(name, env, home / f"{name}.log", registered=client.workers, cwd=ROOT)
        )

        async def go() -> tuple[list[float], float]:
            async with AsyncClient(
                url, broker_url=broker, prefix=prefix, agents=["zero"], min_replicas_acked=replicas
            ) as aclient:
                await _latencies(aclient, 10)  # warm-up
                return await _latencies(aclient, ROUNDS), await _burst(aclient)

        return asyncio.run(go())


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(len(ordered) * 0.9) - 1]
    return f"median {statistics.median(samples) * 1000:6.2f} ms   p90 {p90 * 1000:6.2f} ms"


def run() -> None:
    sys.path.insert(0, str(ROOT))
    from tests.support.redis_server import RedisServer
    from tests.support.replicas import replicate

    with tempfile.TemporaryDirectory(prefix="convoq-acks-") as tmp, ExitStack() as stack:
        home = Path(tmp)
        servers = [RedisServer(home / name) for name in ("broker", "primary", "replica")]
        for server in servers:
            server.start()
            stack.callback(server.stop)
        broker, primary, replica = servers
        replicate(replica, primary.port)
        print(f"{os.cpu_count()} cores shared with other work; load {os.getloadavg()[0]:.1f}")
        print(f"{ROUNDS} sequential turns (zero-latency model), then {BURST} at once\n")
        for replicas in (0, 1, 0, 1):  # interleaved: the machine's load drifts
            latencies, rate = _case(primary.url, broker.url, home, replicas)
            print(f"   min_replicas_acked={replicas}  {_ms(latencies)}   {rate:6.1f} turns/s")


def main() -> None:
    started = time.monotonic()
    run()
    print(f"\n(took {time.monotonic() - started:.0f}s)")


if __name__ == "__main__":
    main()

"""Reading a long history out of the gateway and out of ``convoq export``: what a reader
that only forwards it pays.

One private redis-server holding a conversation of 10,000 turns (a ~200-character
question and a ~600-character answer each), one ``convoq gateway`` process, no worker.
Over one keep-alive HTTP connection, sequential requests of
``GET /v1/conversations/{cid}/messages`` (the first page of 100 messages, the last page,
the last 10 turns), alternating round by round; each row is the median [min-max] over
rounds of a round's requests per second. Then the export document of the same
conversation, built in this process: typed (``export_conversation(...).to_json()``) and,
where this convoq has it, from the stored JSON (``export_json``).

Run ``python -m bench history``.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import httpx

from bench._harness import for_rounds, redis_server, rotated, spread
from bench.compare_memory import populate_convoq
from bench.gateway_latency import KEY, _start_gateway
from convoq.memory import transfer
from convoq.memory.redis import RedisConversationMemory

TURNS = 10_000
CID = "long-history"
PREFIX = "bench"


def _rates(
    calls: dict[str, Callable[[], object]], rounds: int, per_round: int
) -> dict[str, list[float]]:
    """Per call, its requests (or calls) per second in each round, the calls alternating."""
    rates: dict[str, list[float]] = {name: [] for name in calls}
    for n in range(rounds):
        for name in rotated(list(calls), n):
            started = time.perf_counter()
            for _ in range(per_round):
                calls[name]()
            rates[name].append(per_round / (time.perf_counter() - started))
    return rates


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="convoq-bench-") as tmp, ExitStack() as stack:
        home = Path(tmp)
        url = stack.enter_context(redis_server(home / "redis"))
        memory = RedisConversationMemory(url, prefix=PREFIX)
        asyncio.run(populate_convoq(memory, CID, TURNS))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOQ_")}
        env.update(CONVOQ_REDIS_URL=url, CONVOQ_PREFIX=PREFIX, CONVOQ_HOME=str(home))
        base = _start_gateway(stack, env, home)
        http = stack.enter_context(
            httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
        )
        path = f"/v1/conversations/{CID}/messages"

        def get(**params: int) -> Callable[[], object]:
            def call() -> object:
                response = http.get(path, params=params)
                response.raise_for_status()
                return response.content

            return call

        routes = {
            "first page (100 messages)": get(offset=0, limit=100),
            "last page (100 messages)": get(offset=2 * TURNS - 100, limit=100),
            "last 10 turns": get(last_turns=10),
        }
        for call in routes.values():  # warm-up: the connection, the gateway's imports
            call()
        rates = _rates(routes, for_rounds(7, 3), for_rounds(10, 4))
        lines = [f"{TURNS:,} stored turns; gateway GET {path}: requests/s, median [min-max]"
                 " over rounds"]  # fmt: skip
        lines += [f"  {name:<28}{spread(values, 1)}" for name, values in rates.items()]
        exports: dict[str, Callable[[], object]] = {
            "typed (export_conversation)": lambda: transfer.export_conversation(
                memory, CID
            ).to_json(),
        }
        if hasattr(transfer, "export_json"):
            exports["stored JSON (export_json)"] = lambda: transfer.export_json(memory, CID)
        for call in exports.values():
            call()
        export_rates = _rates(exports, for_rounds(5, 3), 2)
        lines.append("export document of the same conversation, in process: ms, median [min-max]")
        for name, values in export_rates.items():
            lines.append(f"  {name:<28}{spread([1000 / v for v in values], 1)}")
        if len(export_rates) == 2:
            typed, raw = export_rates.values()
            ratio = [r / t for r, t in zip(raw, typed, strict=True)]
            lines.append(f"  stored JSON / typed, rate per round: {spread(ratio)}")
        memory.close()
        print("\n".join(lines))

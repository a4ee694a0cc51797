"""Append and window-load cost as a conversation grows: RedisConversationMemory against a
naive store that keeps one JSON file per conversation and rewrites it on every append.

For 10, 1,000 and 10,000 stored turns it prints the median time of one append (one turn)
and of one load of the last 10 turns, with the ratio to the 10-turn case. Redis appends
and window loads should stay flat (O(turn) / O(window)); the naive store grows with the
history. Both are measured in the same run; Redis is a private embedded redis-server
(AOF on, appendfsync everysec) on a unix socket.

Run ``python -m bench memory`` (or ``python -m bench.memory_append``).
"""

from __future__ import annotations

import asyncio
import os
import statistics
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis

from bench._harness import embedded_redis, print_run, timings_ms
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import Message, messages_from_json, messages_to_json
from convoq.window import last_turns

SIZES = (10, 1_000, 10_000)
WINDOW = 10
REDIS_SAMPLES = 200
NAIVE_SAMPLES = 50
POPULATE_BATCH = 250


def a_turn(n: int) -> list[Message]:
    """A plausible turn: a question of ~200 characters and an answer of ~600."""
    question = f"question {n}: " + "what about the weather and the trains tomorrow? " * 4
    return [Message.user(question), Message.assistant(f"answer {n}: " + "it depends. " * 50)]


class NaiveJsonStore:
    """One JSON file per conversation, read, extended and rewritten whole on every append
    (temp file + rename, no fsync)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, cid: str) -> Path:
        return self.directory / f"{cid}.json"

    def load(self, cid: str, keep: int | None = None) -> list[Message]:
        path = self._path(cid)
        messages = messages_from_json(path.read_bytes()) if path.exists() else []
        return last_turns(messages, keep)

    def append(self, cid: str, messages: list[Message]) -> None:
        self.write(cid, self.load(cid) + messages)

    def write(self, cid: str, messages: list[Message]) -> None:
        temp = self._path(cid).with_suffix(".tmp")
        temp.write_bytes(messages_to_json(messages))
        os.replace(temp, self._path(cid))


async def _median_ms(samples: int, call: Callable[[], Awaitable[object]]) -> float:
    return statistics.median(await timings_ms(samples, lambda _n: call()))


async def _redis_row(memory: RedisConversationMemory, size: int) -> tuple[float, float]:
    cid = f"redis-{size}"
    for first in range(0, size, POPULATE_BATCH):
        batch = range(first, min(first + POPULATE_BATCH, size))
        await asyncio.gather(*(memory.aappend(cid, a_turn(n)) for n in batch))
    counter = iter(range(size, size + REDIS_SAMPLES))
    append = await _median_ms(REDIS_SAMPLES, lambda: memory.aappend(cid, a_turn(next(counter))))
    load = await _median_ms(REDIS_SAMPLES, lambda: memory.aload(cid, last_turns=WINDOW))
    assert len(await memory.aload(cid, last_turns=WINDOW)) == 2 * WINDOW
    return append, load


async def _naive_row(store: NaiveJsonStore, size: int) -> tuple[float, float]:
    cid = f"naive-{size}"
    store.write(cid, [m for n in range(size) for m in a_turn(n)])
    counter = iter(range(size, size + NAIVE_SAMPLES))

    async def append() -> None:
        store.append(cid, a_turn(next(counter)))

    async def load() -> None:
        store.load(cid, WINDOW)

    return await _median_ms(NAIVE_SAMPLES, append), await _median_ms(NAIVE_SAMPLES, load)


def _table(rows: dict[str, list[tuple[int, float, float]]]) -> str:
    lines = [
        f"{'store':<11}{'turns':>8}{'append ms':>12}{'x10-turn':>10}{'load-10 ms':>12}"
        f"{'x10-turn':>10}"
    ]
    for store, measured in rows.items():
        base_append, base_load = measured[0][1], measured[0][2]
        for size, append, load in measured:
            lines.append(
                f"{store:<11}{size:>8}{append:>12.3f}{append / base_append:>10.1f}"
                f"{load:>12.3f}{load / base_load:>10.1f}"
            )
    return "\n".join(lines)


async def run() -> str:
    with embedded_redis() as (work, url):
        return await _run(work, url)


async def _run(work: Path, url: str) -> str:
    memory = RedisConversationMemory(url, prefix="bench")
    try:
        rows: dict[str, list[tuple[int, float, float]]] = {"redis": [], "naive-json": []}
        store = NaiveJsonStore(work)
        for size in SIZES:
            rows["redis"].append((size, *await _redis_row(memory, size)))
            rows["naive-json"].append((size, *await _naive_row(store, size)))
        client = redis.Redis.from_url(url)
        version = client.info()["redis_version"]
        client.close()
        head = (
            f"redis-server {version} (embedded, unix socket, AOF everysec); one turn = user"
            f" ~200 chars + assistant ~600 chars; medians of {REDIS_SAMPLES} (redis) /"
            f" {NAIVE_SAMPLES} (naive) operations"
        )
        return head + "\n" + _table(rows)
    finally:
        await memory.aclose()


def main() -> None:
    print_run(run)


if __name__ == "__main__":
    main()

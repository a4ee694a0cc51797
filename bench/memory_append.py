"""Append and window-load cost as a conversation grows: RedisConversationMemory (fast paths
on, and off) against a naive store that keeps one JSON file per conversation and rewrites
it on every append.

For 10, 1,000 and 10,000 stored turns it prints the time of one append (one turn) and of
one load of the last 10 turns, and each size's ratio to the 10-turn case. Every size of
every store is populated before anything is timed; then the (store, size) cells are timed
in alternating rounds (the first cell rotates), so no size meets the server or the
machine in a state of its own (a server that just took 10,000 appends, a busy minute).
Each cell's figure is the median over rounds of its round medians, with the range; the
ratios are taken round by round. Redis is a private embedded redis-server (AOF on,
appendfsync everysec) on a unix socket; each store has its own conversations on it.
Appends made while timing grow each conversation by up to ``rounds x samples`` turns.

Run ``python -m bench memory`` (``--quick``: fewer rounds).
"""

from __future__ import annotations

import asyncio
import os
import statistics
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis

from bench._harness import (
    embedded_redis,
    fast_paths_mode,
    print_run,
    quick,
    ratios,
    rotated,
    spread,
    timings_ms,
)
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import Message, messages_from_json, messages_to_json
from convoq.window import last_turns

SIZES = (10, 1_000, 10_000)
WINDOW = 10
POPULATE_BATCH = 250
# (rounds, samples per round and cell: Redis, naive)
FULL = (10, 20, 3)
QUICK = (3, 20, 2)


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


# A store's calls: (append the turn numbered n, load the last 10 turns) of one conversation.
Calls = tuple[Callable[[str, int], Awaitable[object]], Callable[[str], Awaitable[object]]]


def _redis_calls(memory: RedisConversationMemory) -> Calls:
    async def append(cid: str, n: int) -> None:
        await memory.aappend(cid, a_turn(n))

    async def load(cid: str) -> object:
        return await memory.aload(cid, last_turns=WINDOW)

    return append, load


def _naive_calls(store: NaiveJsonStore) -> Calls:
    async def append(cid: str, n: int) -> None:
        store.append(cid, a_turn(n))

    async def load(cid: str) -> object:
        return store.load(cid, WINDOW)

    return append, load


async def _populate_redis(memory: RedisConversationMemory, cid: str, size: int) -> None:
    for first in range(0, size, POPULATE_BATCH):
        batch = range(first, min(first + POPULATE_BATCH, size))
        await asyncio.gather(*(memory.aappend(cid, a_turn(n)) for n in batch))


async def _timed_rounds(
    stores: dict[str, tuple[str | None, int, Calls]], rounds: int
) -> dict[tuple[str, int, str], list[float]]:
    """Round medians (ms) per (store, size, operation); every cell once per round."""
    cells = [(store, size) for store in stores for size in SIZES]
    medians: dict[tuple[str, int, str], list[float]] = {}
    counter = iter(range(10**9))
    for n in range(rounds):
        for store, size in rotated(cells, n):
            mode, samples, (append, load) = stores[store]
            fast_paths_mode(mode)
            cid = f"{store}-{size}"
            timed = {
                "append": lambda _i, a=append, c=cid: a(c, -next(counter)),
                "load": lambda _i, f=load, c=cid: f(c),
            }
            for op, call in timed.items():
                times = await timings_ms(samples, call)
                medians.setdefault((store, size, op), []).append(statistics.median(times))
    fast_paths_mode(None)
    return medians


def _table(medians: dict[tuple[str, int, str], list[float]], rounds: int) -> str:
    lines = [
        f"median [min-max] over {rounds} rounds of each round's median; x10: per-round ratio"
        " to the 10-turn conversation",
        f"{'store':<12}{'turns':>7}  {'append ms':<27}{'x10':<22}{'load-10 ms':<27}x10",
    ]
    stores = dict.fromkeys(store for store, _, _ in medians)  # in their first round's order
    for store in sorted(stores):
        for size in SIZES:
            cells = []
            for op in ("append", "load"):
                values = medians[store, size, op]
                base = medians[store, SIZES[0], op]
                cells += [spread(values, 3), spread(ratios(values, base), 1)]
            lines.append(
                f"{store:<12}{size:>7}  {cells[0]:<27}{cells[1]:<22}{cells[2]:<27}{cells[3]}"
            )
    return "\n".join(lines)


async def run() -> str:
    with embedded_redis() as (work, url):
        return await _run(work, url)


async def _run(work: Path, url: str) -> str:
    rounds, redis_samples, naive_samples = QUICK if quick() else FULL
    memories: dict[str, RedisConversationMemory] = {}
    for store, mode in (("redis", "on"), ("redis-off", "off")):
        fast_paths_mode(mode)  # the switch is read when the memory builds its client
        memories[store] = RedisConversationMemory(url, prefix=f"bench-{store}")
    fast_paths_mode(None)
    try:
        naive = NaiveJsonStore(work)
        for size in SIZES:  # every size of every store before anything is timed
            for store, memory in memories.items():
                fast_paths_mode("off" if store == "redis-off" else "on")
                await _populate_redis(memory, f"{store}-{size}", size)
            naive.write(f"naive-json-{size}", [m for n in range(size) for m in a_turn(n)])
        stores: dict[str, tuple[str | None, int, Calls]] = {
            "redis": ("on", redis_samples, _redis_calls(memories["redis"])),
            "redis-off": ("off", redis_samples, _redis_calls(memories["redis-off"])),
            "naive-json": (None, naive_samples, _naive_calls(naive)),
        }
        medians = await _timed_rounds(stores, rounds)
        client = redis.Redis.from_url(url)
        version = client.info()["redis_version"]
        client.close()
        head = (
            f"redis-server {version} (embedded, unix socket, AOF everysec); one turn = user"
            f" ~200 chars + assistant ~600 chars; redis-off = CONVOQ_FAST_PATHS=off;"
            f" {redis_samples} (redis) / {naive_samples} (naive) calls per cell and round"
        )
        return head + "\n" + _table(medians, rounds)
    finally:
        fast_paths_mode(None)
        for memory in memories.values():
            await memory.aclose()


def main() -> None:
    print_run(run)


if __name__ == "__main__":
    main()

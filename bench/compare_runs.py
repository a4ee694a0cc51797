"""The measurements of :mod:`bench.compare`, each run ``RUNS`` times into one table."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from bench import peers, sync_hop
from bench.compare import RUNS, Table, start_convoq_worker, start_peer_worker, worker_env
from bench.memory_append import a_turn
from convoq.client import AsyncClient, Client
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import MessageList
from convoq.queue.transport import broker_url_for
from convoq.redis import connect
from convoq.redis._codec import collector_paused

WINDOW = 10
BIG = 10_000
TURN_ROUNDS = 200


async def _median_ms(samples: int, call: Callable[[], Awaitable[object]]) -> float:
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        await call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


async def _interleaved_ms(
    rounds: int, per_round: int, *calls: Callable[[], Awaitable[object]]
) -> list[float]:
    """Median ms of each call, measured in alternating rounds so that each meets the same
    conditions (an AOF fsync, another process's burst) as often as the others."""
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(rounds):
        for samples, call in zip(times, calls, strict=True):
            for _ in range(per_round):
                start = time.perf_counter()
                await call()
                samples.append(time.perf_counter() - start)
    return [statistics.median(samples) * 1000 for samples in times]


def _items(n: int) -> list[dict[str, str]]:
    user, assistant = a_turn(n)
    return [
        {"role": "user", "content": user.text},
        {"role": "assistant", "content": assistant.text},
    ]


# -- 1 and 2: loading history -----------------------------------------------------------------
async def _populate(url: str, memory: RedisConversationMemory, cid: str, turns: int) -> None:
    RedisSession, _ = peers.session_class()
    for first in range(0, turns, 250):
        batch = range(first, min(first + 250, turns))
        await asyncio.gather(*(memory.aappend(cid, a_turn(n)) for n in batch))
    client = aioredis.Redis.from_url(url)
    session = RedisSession(cid, redis_client=client, key_prefix="bench:session")
    for first in range(0, turns, 250):
        await session.add_items(
            [i for n in range(first, min(first + 250, turns)) for i in _items(n)]
        )
    # langchain's own format (LPUSH of message_to_dict JSON, newest first), pipelined.
    sync = redis.Redis.from_url(url)
    with sync.pipeline(transaction=False) as pipe:
        for n in range(turns):
            user, assistant = a_turn(n)
            for role, said in (("human", user.text), ("ai", assistant.text)):
                pipe.lpush(f"message_store:{cid}", json.dumps(_langchain_dict(role, said)))
        pipe.execute()
    sync.close()
    await client.aclose()


def _langchain_dict(role: str, text: str) -> dict[str, Any]:
    """What langchain's ``message_to_dict`` stores for a plain human or ai message."""
    data = {"content": text, "additional_kwargs": {}, "response_metadata": {}, "type": role,
            "name": None, "id": None}  # fmt: skip
    if role == "ai":
        data.update(tool_calls=[], invalid_tool_calls=[], usage_metadata=None)
    return {"type": role, "data": data}


def _langchain_load(url: str, cid: str) -> tuple[Callable[[], object], str]:
    """langchain's RedisChatMessageHistory.messages, or its commands re-created (LRANGE
    0 -1, json.loads per item, newest first reversed) when it is not installed."""
    try:
        from langchain_community.chat_message_histories import RedisChatMessageHistory
    except ImportError:
        sync = redis.Redis.from_url(url)

        def recreated() -> object:
            raw = sync.lrange(f"message_store:{cid}", 0, -1)
            return [json.loads(m.decode("utf-8")) for m in raw[::-1]]

        return recreated, "langchain (re-created: not installed)"
    history = RedisChatMessageHistory(cid, url=url)
    return (lambda: history.messages), "langchain"


async def _loads(url: str, table: Table, populated: set[str]) -> None:
    RedisSession, name = peers.session_class()
    client = connect(url)
    memory = RedisConversationMemory(client=client, prefix="bench")
    for size in (10, BIG):
        cid = f"load-{size}"
        if cid not in populated:
            await _populate(url, memory, cid, size)
            populated.add(cid)
        session = RedisSession(cid, redis_client=client, key_prefix="bench:session")
        what = f"load last {WINDOW} turns of {size:,}"
        ours, theirs = await _interleaved_ms(
            10,
            20,
            lambda c=cid: memory.aload(c, last_turns=WINDOW),  # type: ignore[misc]
            lambda s=session: s.get_items(limit=2 * WINDOW),  # type: ignore[misc]
        )
        table.add(f"w{size}", "1", f"{what}: convoq", "ms", ours)
        table.add(f"w{size}s", "1", f"{what}: {name}", "ms", theirs)
    cid = f"load-{BIG}"
    session = RedisSession(cid, redis_client=client, key_prefix="bench:session")
    langchain_load, langchain_name = _langchain_load(url, cid)
    assert len(await memory.aload(cid)) == 2 * BIG
    table.add("full", "2", f"full load of {BIG:,} turns: convoq", "ms",
              await _median_ms(5, lambda: memory.aload(cid)))  # fmt: skip
    table.add("fulls", "2", f"full load of {BIG:,} turns: {name}", "ms",
              await _median_ms(5, session.get_items))  # fmt: skip

    async def langchain() -> object:
        return langchain_load()

    table.add("fulll", "2", f"full load of {BIG:,} turns: {langchain_name}", "ms",
              await _median_ms(5, langchain))  # fmt: skip
    # The floor of any load that returns Message objects: pydantic's compiled validation
    # of the same messages' JSON, from bytes already in memory (no Redis, no headers).
    raw = MessageList.dump_json(await memory.aload(cid))

    async def validate_only() -> object:
        with collector_paused(BIG):
            return MessageList.validate_json(raw)

    table.add("fullv", "2", f"validate_json alone of those {2 * BIG:,} messages", "ms",
              await _median_ms(5, validate_only))  # fmt: skip
    await client.aclose()


# -- 6: Redis commands and client CPU per turn -------------------------------------------------
def _commands(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if not k.endswith(("info", "config")))


def _per_turn_commands(r: redis.Redis, run: Callable[[], None], turns: int) -> float:
    r.config_resetstat()
    idle_started = time.perf_counter()
    time.sleep(1.0)
    idle_rate = _commands(r) / (time.perf_counter() - idle_started)  # pollers, sweeper
    r.config_resetstat()
    started = time.perf_counter()
    for _ in range(turns):
        run()
    busy = _commands(r) - idle_rate * (time.perf_counter() - started)
    return busy / turns


def _commands_and_cpu(url: str, client: Client, table: Table) -> None:
    r = redis.Redis.from_url(url)

    def ours() -> None:
        client.submit(f"cmd-{uuid.uuid4().hex[:10]}", "hi", agent="zero").wait(30)

    def hand() -> None:
        peers.celery_app.send_task("bench.handbuilt", args=[f"cmd-{uuid.uuid4().hex}", "hi"]).get(
            timeout=30
        )

    table.add(
        "cmds", "6", "Redis commands per plain turn: convoq", "", _per_turn_commands(r, ours, 50)
    )
    table.add(
        "cmdsh",
        "6",
        "Redis commands per plain turn: hand-built",
        "",
        _per_turn_commands(r, hand, 50),
    )
    r.close()
    cpu = time.process_time()
    handles = [
        client.submit(f"cpu-{uuid.uuid4().hex[:10]}", "hi", agent="zero") for _ in range(200)
    ]
    table.add(
        "cpu", "6", "submit() client CPU: convoq", "ms", (time.process_time() - cpu) / 200 * 1000
    )
    cpu = time.process_time()
    results = [peers.celery_app.send_task("bench.bare", args=["hi"]) for _ in range(200)]
    table.add(
        "cpus",
        "6",
        "send_task() client CPU: Celery",
        "ms",
        (time.process_time() - cpu) / 200 * 1000,
    )
    for handle in handles:
        handle.wait(60)
    for result in results:
        result.get(timeout=60)


# -- 7: end to end -----------------------------------------------------------------------------
def _latency(client: Client, table: Table) -> None:
    def ours() -> None:
        client.submit(f"lat-{uuid.uuid4().hex[:10]}", "hi", agent="zero").wait(30)

    def bare() -> None:
        peers.celery_app.send_task("bench.bare", args=["hi"]).get(timeout=30)

    def hand() -> None:
        cid = f"lat-{uuid.uuid4().hex[:10]}"
        peers.celery_app.send_task("bench.handbuilt", args=[cid, "hi"]).get(timeout=30)

    for key, what, call in [("e2e", "convoq", ours), ("e2eb", "bare Celery .get()", bare),
                            ("e2eh", "hand-built Celery+RedisSession", hand)]:  # fmt: skip
        for _ in range(20):
            call()
        samples = []
        for _ in range(TURN_ROUNDS):
            start = time.perf_counter()
            call()
            samples.append(time.perf_counter() - start)
        table.add(
            key, "7", f"submit->result, zero model: {what}", "ms", statistics.median(samples) * 1000
        )


async def _convoq_burst(url: str, prefix: str, conversations: int, turns: int, agent: str) -> float:
    async with AsyncClient(url, prefix=prefix) as client:

        async def one(cid: str) -> list[Any]:
            return [await client.submit(cid, f"turn {i}", agent=agent) for i in range(turns)]

        started = time.perf_counter()
        groups = await asyncio.gather(
            *(one(f"b-{uuid.uuid4().hex[:10]}") for _ in range(conversations))
        )
        handles = [h for group in groups for h in group]
        await asyncio.gather(*(h.wait(300) for h in handles))
        return len(handles) / (time.perf_counter() - started)


def _bare_burst(conversations: int, turns: int) -> float:
    started = time.perf_counter()
    results = [
        peers.celery_app.send_task("bench.bare", args=["hi"]) for _ in range(conversations * turns)
    ]
    for result in results:
        result.get(timeout=300)
    return len(results) / (time.perf_counter() - started)


# -- 5: fair slots -----------------------------------------------------------------------------
def _fair_slots(url: str, stack: ExitStack, home: Path, table: Table, prefix: str) -> None:
    table.add("fair", "5", "turns/s, 32 slots, 100 conv x 4 turns, 500 ms model", "/s",
              asyncio.run(_convoq_burst(url, prefix, 100, 4, "slow")))  # fmt: skip
    table.add("lone", "5", "turns/s, one conversation x 8 turns, 500 ms model", "/s",
              asyncio.run(_convoq_burst(url, prefix, 1, 8, "slow")))  # fmt: skip


# -- 3 and 4: sync memory calls, blocking model functions -------------------------------------
def _sync_and_blocking(url: str, prefix: str, table: Table) -> None:
    hop = sync_hop.measure(url, rounds=2)
    for op in ("append", "load-10"):
        for flavour, what in (("async", "async, client in the caller's loop"), ("sync", "sync")):
            table.add(f"{op}-{flavour}", "3", f"memory {op}: {what}", "µs", hop[op, flavour])
    # Untimed: every slot's connections and the pool's threads exist before either is timed.
    asyncio.run(_convoq_burst(url, prefix, 100, 1, "blocking"))
    table.add("bsync", "4", "turns/s, 100 slots, 100 conv x 4 turns, sync 500 ms model", "/s",
              asyncio.run(_convoq_burst(url, prefix, 100, 4, "blocking")))  # fmt: skip
    table.add("basync", "4", "same, async 500 ms model", "/s",
              asyncio.run(_convoq_burst(url, prefix, 100, 4, "slow")))  # fmt: skip


def run_all(url: str, home: Path) -> Table:
    table = Table()
    populated: set[str] = set()
    prefix, fair_prefix = f"b{uuid.uuid4().hex[:6]}", f"f{uuid.uuid4().hex[:6]}"
    env = worker_env(url, prefix, home, 100)
    fair_env = worker_env(url, fair_prefix, home, 32)
    peers.celery_app.conf.update(broker_url=broker_url_for(url), result_backend=broker_url_for(url))
    with (
        ExitStack() as stack,
        Client(url, prefix=prefix) as client,
        Client(url, prefix=fair_prefix) as fair,
    ):
        start_peer_worker(stack, env, home)
        start_convoq_worker(stack, env, home, client)
        start_convoq_worker(stack, fair_env, home, fair)
        for run in range(RUNS):
            print(f"run {run + 1}/{RUNS}", flush=True)
            asyncio.run(_loads(url, table, populated))
            _latency(client, table)
            table.add("burst", "7", "burst 50 conv x 4 turns, zero model: convoq", "/s",
                      asyncio.run(_convoq_burst(url, prefix, 50, 4, "zero")))  # fmt: skip
            table.add("burstb", "7", "burst 50 x 4 tasks: bare Celery", "/s", _bare_burst(50, 4))
            _commands_and_cpu(url, client, table)
            _fair_slots(url, stack, home, table, fair_prefix)
            _sync_and_blocking(url, prefix, table)
    _bars(table)
    return table


def _ratio(table: Table, a: str, b: str) -> float:
    return table.rows[a].median / table.rows[b].median


def _bars(t: Table) -> None:
    def window(size: int) -> tuple[str, bool]:
        r = _ratio(t, f"w{size}", f"w{size}s")
        return f"load last 10 at {size:,} turns: convoq/RedisSession = {r:.2f}x (<= 1)", r <= 1

    t.bar("1", lambda: window(10))
    t.bar("1", lambda: window(BIG))

    def flat() -> tuple[str, bool]:
        r = _ratio(t, f"w{BIG}", "w10")
        return f"load last 10: {BIG:,} turns / 10 turns = {r:.2f}x (flat: <= 1.2)", r <= 1.2

    t.bar("1", flat)

    def full() -> tuple[str, bool]:
        r, floor = _ratio(t, "full", "fulls"), _ratio(t, "fullv", "fulls")
        return (
            f"full load at {BIG:,}: convoq/RedisSession = {r:.2f}x (<= 0.33; validating"
            f" the messages alone is {floor:.2f}x)",
            r <= 1 / 3,
        )

    t.bar("2", full)

    def hop(op: str) -> tuple[str, bool]:
        d = t.rows[f"{op}-sync"].median - t.rows[f"{op}-async"].median
        return f"sync memory {op}: {d:+.0f} µs over the async call (<= +50)", d <= 50

    t.bar("3", lambda: hop("append"))
    t.bar("3", lambda: hop("load-10"))

    def blocking() -> tuple[str, bool]:
        r = _ratio(t, "bsync", "basync")
        # As concurrent as async code, within run-to-run noise (the default executor: ~0.1x).
        return f"sync 500 ms model: {r:.2f}x the async model's turns/s (>= 0.8)", r >= 0.8

    t.bar("4", blocking)

    def fair() -> tuple[str, bool]:
        v = t.rows["fair"].median
        return f"32 slots: {v:.1f} turns/s of a 64/s cap = {v / 64:.2f} (>= 0.9)", v >= 0.9 * 64

    t.bar("5", fair)

    def commands() -> tuple[str, bool]:
        v = t.rows["cmds"].median
        return f"{v:.0f} Redis commands per plain turn (<= 30)", v <= 30

    t.bar("6", commands)

    def cpu() -> tuple[str, bool]:
        v = t.rows["cpu"].median
        return f"submit() {v:.2f} ms client CPU (<= 0.6)", v <= 0.6

    t.bar("6", cpu)

    def e2e() -> tuple[str, bool]:
        r, hand = _ratio(t, "e2e", "e2eb"), _ratio(t, "e2e", "e2eh")
        return (
            f"e2e: {r:.2f}x bare Celery (<= 1.5), {hand:.2f}x hand-built (< 1)",
            r <= 1.5 and hand < 1,
        )

    t.bar("7", e2e)

    def burst() -> tuple[str, bool]:
        r = _ratio(t, "burst", "burstb")
        return f"burst: {r:.2f}x bare Celery (>= 0.8)", r >= 0.8

    t.bar("7", burst)

"""The queued rows of :mod:`bench.compare`: turns end to end, bursts, worker CPU and Redis
commands per turn, for convoq (fast paths on and off), bare Celery and the hand-built
Celery task, each system on its own private redis-server with its own worker process.

- End to end: one turn at a time, submit to result, on a new conversation (zero model:
  an async function answering "ok"; a 300-byte reply; a sync function) and on
  conversations holding 10 and 1,000 stored turns, populated before timing for convoq
  and the hand-built task alike: each 10-turn turn on a conversation of its own, each
  round's 1,000-turn turns on a conversation of that round (1,000 to 1,000 + turns per
  round). Each round times every (row, system) cell in turn.
- Burst: 50 conversations x 4 turns, the same 50 submitter threads for every system (each
  runs one conversation: its 4 turns submitted, then awaited). Peers: bare Celery (4
  tasks), the hand-built task as a Celery chain per conversation (its turns in order,
  what convoq guarantees) and unordered (4 conversations of one turn each).
- Worker CPU per turn: utime+stime (and children's) of the system's worker processes
  over each burst of 200 turns, / 200.
- Redis commands per plain turn: ``INFO commandstats`` of the system's own server (scripts'
  inner calls included) over a batch of turns, less the idle rate of its pollers.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen

import redis
import redis.asyncio as aioredis
from celery import Celery, chain

from bench import peers, turn_cost
from bench._harness import fast_paths_mode, for_rounds, redis_server, rotated
from bench.compare import (
    Table,
    process_cpu_s,
    start_convoq_worker,
    start_peer_worker,
    worker_env,
)
from bench.compare_memory import populate_convoq, populate_session
from convoq.client import Client
from convoq.memory.redis import RedisConversationMemory
from convoq.redis import connect
from convoq.settings import ConvoqSettings

SECTION_E2E = "end to end, one turn at a time (a server and a worker per system)"
SECTION_BURST = "burst: 50 conversations x 4 turns, 50 submitter threads"
SECTION_COST = "cost per plain turn"
CONVERSATIONS, TURNS_EACH = 50, 4
STORED = (10, 1_000)
WARM_UP = 10  # untimed turns of each cell before the first round
_CONCURRENT_TURNS = 500  # at most this many appends in flight while populating
# convoq's agent (bench.compare) for each kind of zero-latency model; the peers call a
# plain function in every case, so "sync" is their "ok".
AGENTS = {"ok": "zero", "300": "zero300", "sync": "zerosync"}


@dataclass
class System:
    """One queued system: ``turn(conversation id, reply kind)`` runs one turn to its end;
    ``conversation(n)`` runs burst conversation ``n`` (its 4 turns) to its end."""

    key: str
    name: str
    url: str
    worker: Popen[bytes]
    turn: Callable[[str, str], None]
    conversation: Callable[[str], None]
    # stored turns -> the populated conversations' ids (see ``stored_conversation``)
    stored: dict[int, list[str]] = field(default_factory=dict)

    def stored_conversation(self, size: int, round_number: int) -> str:
        """A conversation holding ``size`` stored turns: for 10, one never used before;
        else the round's own (round -1: the warm-up's)."""
        if size == STORED[0]:
            return self.stored[size].pop()
        return self.stored[size][round_number + 1]


def _new() -> str:
    return f"c-{uuid.uuid4().hex[:12]}"


def _convoq(key: str, name: str, url: str, worker: Popen[bytes], client: Client) -> System:
    mode = "off" if key == "off" else "on"

    def turn(cid: str, kind: str) -> None:
        fast_paths_mode(mode)
        client.submit(cid, "hi", agent=AGENTS[kind]).wait(30)

    def conversation(cid: str) -> None:
        handles = [client.submit(cid, f"turn {i}", agent="zero") for i in range(TURNS_EACH)]
        for handle in handles:
            handle.wait(120)

    return System(key, name, url, worker, turn, conversation)


def _bare(url: str, worker: Popen[bytes], app: Celery) -> System:
    def turn(_cid: str, kind: str) -> None:
        app.send_task("bench.bare", args=["hi", _reply(kind)]).get(timeout=30)

    def conversation(_cid: str) -> None:
        results = [app.send_task("bench.bare", args=["hi"]) for _ in range(TURNS_EACH)]
        for result in results:
            result.get(timeout=120)

    return System("bare", "bare Celery .get()", url, worker, turn, conversation)


def _hand(url: str, worker: Popen[bytes], app: Celery) -> tuple[System, System]:
    """The hand-built task; its burst runs one turn in each of 4 conversations (no order
    to keep). And the same task as a Celery chain per conversation (turns in order)."""

    def turn(cid: str, kind: str) -> None:
        app.send_task("bench.handbuilt", args=[cid, "hi", _reply(kind)]).get(timeout=30)

    def unordered(_cid: str) -> None:  # one turn in each of 4 conversations
        results = [app.send_task("bench.handbuilt", args=[_new(), "hi"]) for _ in range(4)]
        for result in results:
            result.get(timeout=120)

    def ordered(cid: str) -> None:  # a chain: each turn starts when the one before ended
        steps = [app.signature("bench.handbuilt", args=[cid, f"turn {i}"], immutable=True)
                 for i in range(TURNS_EACH)]  # fmt: skip
        chain(*steps).apply_async().get(timeout=120)

    name = "hand-built Celery+RedisSession"
    return (
        System("hand", name, url, worker, turn, unordered),
        System("chain", f"{name}, a chain per conversation", url, worker, turn, ordered),
    )


def _reply(kind: str) -> str:
    return "300" if kind == "300" else "ok"


# -- setup -------------------------------------------------------------------------------------
def _start(stack: ExitStack, home: Path) -> dict[str, System]:
    urls = {
        k: stack.enter_context(redis_server(home / k)) for k in ("convoq", "off", "bare", "hand")
    }
    systems: dict[str, System] = {}
    for key, mode, name in (("convoq", "on", "convoq"), ("off", "off", "convoq, fast paths off")):
        prefix = f"b{uuid.uuid4().hex[:6]}"
        fast_paths_mode(mode)
        settings = ConvoqSettings.resolve(
            redis_url=urls[key], prefix=prefix, home=home / key, fast_paths=mode == "on"
        )
        client = stack.enter_context(Client(settings=settings))
        env = worker_env(urls[key], prefix, home / key, 100, fast_paths=mode)
        worker = start_convoq_worker(stack, env, home, client)
        systems[key] = _convoq(key, name, urls[key], worker, client)
        _populate_convoq(urls[key], prefix, mode, systems[key])
    fast_paths_mode("on")
    for key in ("bare", "hand"):
        app = peers.make_app(urls[key])
        worker = start_peer_worker(stack, worker_env(urls[key], "p", home, 100), home, app)
        if key == "bare":
            systems[key] = _bare(urls[key], worker, app)
        else:
            hand, ordered = _hand(urls[key], worker, app)
            systems.update(hand=hand, chain=ordered)
            _populate_hand(urls[key], hand)
    return systems


def _populate_convoq(url: str, prefix: str, mode: str, system: System) -> None:
    async def populate() -> None:
        fast_paths_mode(mode)
        memory = RedisConversationMemory(client=connect(url), prefix=prefix)
        try:
            for size, cids in _stored_ids().items():
                system.stored[size] = cids
                step = _CONCURRENT_TURNS // size or 1  # conversations populated at once
                for first in range(0, len(cids), step):
                    await asyncio.gather(
                        *(populate_convoq(memory, c, size) for c in cids[first : first + step])
                    )
            for size, cids in system.stored.items():
                assert len(await memory.aload(cids[-1])) == 2 * size
        finally:
            await memory.aclose()

    asyncio.run(populate())


def _stored_ids() -> dict[int, list[str]]:
    """The conversations to populate: for 10 turns one per timed turn (and warm-up turn),
    for 1,000 one per round (and the warm-up)."""
    rounds, per_round = _rounds(), _per_round()
    return {
        STORED[0]: [f"stored-10-{n}" for n in range(rounds * per_round + WARM_UP)],
        STORED[1]: [f"stored-1000-{n}" for n in range(rounds + 1)],
    }


def _rounds() -> int:
    return for_rounds(10, 3)


def _per_round() -> int:
    return for_rounds(30, 10)


def _populate_hand(url: str, system: System) -> None:
    session_type, _ = peers.session_class()

    async def populate() -> None:
        client = aioredis.Redis.from_url(url)
        try:
            for size, cids in _stored_ids().items():
                system.stored[size] = cids
                sessions = [session_type(cid, redis_client=client, key_prefix=peers.HAND_PREFIX)
                            for cid in cids]  # fmt: skip
                step = _CONCURRENT_TURNS // size or 1
                for first in range(0, len(sessions), step):
                    await asyncio.gather(
                        *(populate_session(s, size) for s in sessions[first : first + step])
                    )
            for size, cids in system.stored.items():
                last = session_type(cids[-1], redis_client=client, key_prefix=peers.HAND_PREFIX)
                assert len(await last.get_items()) == 2 * size
        finally:
            await client.aclose()

    asyncio.run(populate())


# -- measurements ------------------------------------------------------------------------------
# (row key, row title, reply kind, stored turns (0: a new conversation), systems)
E2E_ROWS = [
    ("new", "new conversation, zero model (async fn)", "ok", 0, ("convoq", "off", "bare", "hand")),
    ("new300", "new conversation, 300-byte reply", "300", 0, ("convoq", "off", "bare", "hand")),
    ("newsync", "new conversation, sync model fn", "sync", 0, ("convoq", "off")),
    ("h10", "10 stored turns, zero model", "ok", 10, ("convoq", "off", "hand")),
    ("h1000", "1,000 stored turns, zero model", "ok", 1_000, ("convoq", "off", "hand")),
]


def _end_to_end(systems: dict[str, System], table: Table) -> None:
    cells = [(row, key) for row in E2E_ROWS for key in row[4]]
    for row, key in cells:  # warm-up, untimed: connections, imports, the workers' threads
        _timed_turns(systems[key], row[2], row[3], WARM_UP, -1)
    for n in range(_rounds()):
        for (row_key, title, kind, stored, _), key in rotated(cells, n):
            cpu = process_cpu_s(systems[key].worker.pid)
            ms = _timed_turns(systems[key], kind, stored, _per_round(), n)
            cpu = process_cpu_s(systems[key].worker.pid) - cpu
            table.add(f"{row_key}-{key}", SECTION_E2E, f"{title}: {systems[key].name}", "ms",
                      statistics.median(ms))  # fmt: skip
            if row_key == "h10":  # turns one at a time, each on a 10-turn history
                table.add(f"cpu1-{key}", SECTION_E2E,
                          f"worker CPU per turn, one at a time (10 stored turns): "
                          f"{systems[key].name}", "ms", cpu / _per_round() * 1000)  # fmt: skip
    for row_key, title, _, _, keys in E2E_ROWS:
        base = "new-bare" if row_key == "newsync" else f"{row_key}-bare"
        if "bare" in keys or row_key == "newsync":
            table.ratio(f"{title}: convoq / bare Celery", f"{row_key}-convoq", base)
        if "hand" in keys:
            table.ratio(f"{title}: convoq / hand-built", f"{row_key}-convoq", f"{row_key}-hand")
        table.ratio(f"{title}: convoq off / on", f"{row_key}-off", f"{row_key}-convoq")
    table.ratio("worker CPU per turn, one at a time: convoq / hand-built", "cpu1-convoq",
                "cpu1-hand")  # fmt: skip


def _timed_turns(
    system: System, kind: str, stored: int, turns: int, round_number: int
) -> list[float]:
    samples = []
    for _ in range(turns):
        cid = system.stored_conversation(stored, round_number) if stored else _new()
        start = time.perf_counter()
        system.turn(cid, kind)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def _bursts(systems: dict[str, System], table: Table) -> None:
    keys = ["convoq", "off", "bare", "chain", "hand"]
    turns = CONVERSATIONS * TURNS_EACH
    with ThreadPoolExecutor(CONVERSATIONS) as pool:
        for key in keys:  # warm-up: the threads, their connections
            _burst(pool, systems[key])
        for n in range(for_rounds(8, 3)):
            for key in rotated(keys, n):
                system = systems[key]
                mode = "off" if key == "off" else "on"
                fast_paths_mode(mode)
                cpu = process_cpu_s(system.worker.pid)
                seconds = _burst(pool, system)
                cpu = process_cpu_s(system.worker.pid) - cpu
                table.add(f"burst-{key}", SECTION_BURST, f"turns/s: {system.name}", "/s",
                          turns / seconds)  # fmt: skip
                table.add(f"cpu-{key}", SECTION_BURST, f"worker CPU per turn: {system.name}",
                          "ms", cpu / turns * 1000)  # fmt: skip
    table.ratio("burst: convoq / hand-built chain", "burst-convoq", "burst-chain")
    table.ratio("burst: convoq / bare Celery", "burst-convoq", "burst-bare")
    table.ratio("burst: convoq off / on", "burst-off", "burst-convoq")
    table.ratio("worker CPU per turn: convoq / hand-built chain", "cpu-convoq", "cpu-chain")
    table.ratio("worker CPU per turn: convoq off / on", "cpu-off", "cpu-convoq")


def _burst(pool: ThreadPoolExecutor, system: System) -> float:
    cids = [_new() for _ in range(CONVERSATIONS)]
    started = time.perf_counter()
    for done in [pool.submit(system.conversation, cid) for cid in cids]:
        done.result(timeout=300)
    return time.perf_counter() - started


def _commands(systems: dict[str, System], table: Table) -> None:
    keys = ["convoq", "off", "bare", "hand"]
    servers = {key: redis.Redis.from_url(systems[key].url) for key in keys}
    try:
        for n in range(for_rounds(3, 2)):
            for key in rotated(keys, n):
                system = systems[key]

                def one(s: System = system) -> None:
                    s.turn(_new(), "ok")

                per_turn = turn_cost.commands_per_turn(servers[key], one, 30)
                table.add(f"cmds-{key}", SECTION_COST,
                          f"Redis commands per plain turn: {system.name}", "",
                          sum(per_turn.values()))  # fmt: skip
    finally:
        for server in servers.values():
            server.close()
    table.ratio("Redis commands per turn: convoq / hand-built", "cmds-convoq", "cmds-hand")


def run(home: Path, table: Table) -> None:
    """Start the queued systems (servers, workers, populated histories), measure, stop."""
    with ExitStack() as stack:
        systems = _start(stack, home)
        try:
            _end_to_end(systems, table)
            _bursts(systems, table)
            _commands(systems, table)
        finally:
            fast_paths_mode(None)

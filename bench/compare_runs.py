"""The queued rows of :mod:`bench.compare`: turns end to end, bursts, worker CPU and Redis
commands per turn, for convoq (fast paths on and off), bare Celery and the hand-built
Celery task, each system on its own private redis-server with its own worker process,
and its client side (submitters, waiters) in a process of its own
(:mod:`bench.compare_sides`): no system's threads, heap or garbage collector slow
another's. This process only orchestrates the rounds and reads the workers' CPU and the
servers' command counts.

- End to end: one turn at a time, submit to result: on a new conversation ("ok" from an
  async function; a 300-byte reply; a sync function), on conversations of 10 stored
  turns (a new one for each turn; "ok" and the 300-byte reply) and of 1,000 (one per
  round), populated before timing for convoq and the hand-built task alike.
- Burst: 50 conversations x 4 turns, 50 submitter threads (each runs one conversation:
  its 4 turns submitted, then awaited): "ok" on new conversations, a 300-byte reply on
  new conversations and on conversations of 10 stored turns. Peers: bare Celery (4
  tasks), the hand-built task as a Celery chain per conversation (its turns in order,
  what convoq guarantees) and unordered (4 conversations of one turn each).
- Worker CPU per turn: the run time of the system's worker process (and children) over
  each burst, / 200, and over each cell of the 10-stored-turns rows, / its turns.
- Redis commands per turn: ``INFO commandstats`` of the system's own server (scripts'
  inner calls included) over 30 turns, less the idle rate of its pollers: on new
  conversations and on conversations with stored turns.
"""

from __future__ import annotations

import asyncio
import functools
import os
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from subprocess import Popen
from typing import Any

import redis
import redis.asyncio as aioredis

from bench import peers
from bench._harness import fast_paths_mode, for_rounds, redis_server, rotated
from bench._procs import Remote
from bench.compare import (
    Table,
    process_cpu_s,
    start_convoq_worker,
    start_peer_worker,
    worker_env,
)
from bench.compare_memory import populate_convoq, populate_session
from bench.compare_sides import CONVERSATIONS, TURNS_EACH
from convoq.client import Client
from convoq.memory.redis import RedisConversationMemory
from convoq.redis import KeySchema, connect
from convoq.settings import ConvoqSettings

SECTION_E2E = "end to end, one turn at a time (a server and a worker per system)"
SECTION_BURST = f"burst: {CONVERSATIONS} conversations x {TURNS_EACH} turns"
SECTION_COST = "cost per turn"
STORED = (10, 1_000)
WARM_UP = 10  # untimed turns of each cell before the first round
_CONCURRENT_TURNS = 500  # at most this many appends in flight while populating
NAMES = {
    "convoq": "convoq",
    "off": "convoq, fast paths off",
    "bare": "bare Celery .get()",
    "hand": "hand-built Celery+RedisSession",
    "chain": "hand-built Celery+RedisSession, a chain per conversation",
}
# (row key, row title, reply kind, stored turns (0: a new conversation), systems)
E2E_ROWS = [
    ("new", "new conversation, ok", "ok", 0, ("convoq", "off", "bare", "hand")),
    ("new300", "new conversation, 300-byte reply", "300", 0, ("convoq", "off", "bare", "hand")),
    ("newsync", "new conversation, sync model fn", "sync", 0, ("convoq", "off")),
    ("h10", "10 stored turns, ok", "ok", 10, ("convoq", "off", "hand")),
    ("h10x300", "10 stored turns, 300-byte reply", "300", 10, ("convoq", "off", "bare", "hand")),
    ("h1000", "1,000 stored turns, ok", "ok", 1_000, ("convoq", "off", "hand")),
]
# (key, title, reply kind, stored turns, systems)
BURSTS = [
    ("burst", "ok, new conversations", "ok", 0, ("convoq", "off", "bare", "chain", "hand")),
    ("burst300", "300-byte reply, new conversations", "300", 0, ("convoq", "bare", "chain")),
    ("burst10x300", "300-byte reply, 10 stored turns", "300", 10,
     ("convoq", "bare", "chain", "hand")),
]  # fmt: skip


class Stored:
    """The populated conversations of each (system, purpose), handed out once each."""

    def __init__(self) -> None:
        self.pools: dict[tuple[str, str], list[str]] = {}

    def take(self, system: str, purpose: str, n: int) -> list[str]:
        pool = self.pools[system, purpose]
        taken, self.pools[system, purpose] = pool[:n], pool[n:]
        assert len(taken) == n, f"not enough populated conversations for {system} {purpose}"
        return taken


def _rounds() -> int:
    return for_rounds(10, 3)


def _per_round() -> int:
    return for_rounds(30, 10)


def _burst_rounds() -> int:
    return for_rounds(8, 3)


def _wanted() -> dict[str, int]:
    """Conversations of 10 stored turns each system needs, by purpose."""
    # Two rows run on them (ok, the 300-byte reply), each with its warm-up.
    e2e = 2 * (_rounds() * _per_round() + WARM_UP)
    bursts = (_burst_rounds() + 1) * CONVERSATIONS
    return {"e2e10": e2e, "burst10": bursts, "cmds10": 2 * 30}


# -- setup ---------------------------------------------------------------------------------
class Setup:
    """Servers, workers and client sides of every system; the populated conversations."""

    def __init__(self, stack: ExitStack, home: Path) -> None:
        self.urls = {k: stack.enter_context(redis_server(home / k)) for k in
                     ("convoq", "off", "bare", "hand")}  # fmt: skip
        self.workers: dict[str, Popen[bytes]] = {}
        self.sides: dict[str, Remote] = {}
        self.stored = Stored()
        self.h1000: dict[str, list[str]] = {}
        self.prefixes: dict[str, str] = {}
        for key, mode in (("convoq", "on"), ("off", "off")):
            self._convoq(stack, home, key, mode)
        fast_paths_mode(None)
        for key in ("bare", "hand"):
            app = peers.make_app(self.urls[key])
            self.workers[key] = start_peer_worker(
                stack, worker_env(self.urls[key], "p", home, 100), home, app
            )
        self.workers["chain"] = self.workers["hand"]
        self.urls["chain"] = self.urls["hand"]
        self._populate_hand()
        sides: dict[str, tuple[str, tuple[Any, ...]]] = {
            "bare": ("BareSide", (self.urls["bare"],)),
            "hand": ("HandSide", (self.urls["hand"], False)),
            "chain": ("HandSide", (self.urls["hand"], True)),
        }
        for key, (factory, args) in sides.items():
            self.sides[key] = stack.enter_context(_remote(f"bench.compare_sides.{factory}", *args))

    def _convoq(self, stack: ExitStack, home: Path, key: str, mode: str) -> None:
        prefix = f"b{uuid.uuid4().hex[:6]}"
        self.prefixes[key] = prefix
        fast_paths_mode(mode)
        settings = ConvoqSettings.resolve(
            redis_url=self.urls[key], prefix=prefix, home=home / key, fast_paths=mode == "on"
        )
        client = stack.enter_context(Client(settings=settings))  # waits for the worker
        env = worker_env(self.urls[key], prefix, home / key, 100, fast_paths=mode)
        self.workers[key] = start_convoq_worker(stack, env, home, client)
        self._populate_convoq(key, prefix, mode)
        side = _remote("bench.compare_sides.ConvoqSide", self.urls[key], prefix, str(home / key),
                       mode)  # fmt: skip
        self.sides[key] = stack.enter_context(side)

    def _ids(self, system: str) -> dict[str, list[str]]:
        wanted = _wanted()
        if system == "hand":  # unordered bursts: 4 conversations per burst slot
            wanted["burst10x4"] = wanted["burst10"] * TURNS_EACH
        return {purpose: [f"{purpose}-{n}" for n in range(count)]
                for purpose, count in wanted.items()}  # fmt: skip

    def _populate_convoq(self, key: str, prefix: str, mode: str) -> None:
        ids = self._ids(key)
        big = [f"stored-1000-{n}" for n in range(_rounds() + 1)]

        async def populate() -> None:
            fast_paths_mode(mode)
            memory = RedisConversationMemory(client=connect(self.urls[key]), prefix=prefix)
            try:
                for size, cids in [(10, [c for v in ids.values() for c in v]), (1_000, big)]:
                    step = _CONCURRENT_TURNS // size or 1
                    for first in range(0, len(cids), step):
                        await asyncio.gather(
                            *(populate_convoq(memory, c, size) for c in cids[first : first + step])
                        )
            finally:
                await memory.aclose()

        asyncio.run(populate())
        for purpose, cids in ids.items():
            self.stored.pools[key, purpose] = cids
        self.h1000[key] = big

    def _populate_hand(self) -> None:
        """The hand-built task's conversations: its own rows' (each on RedisSession's
        keys), and for its unordered bursts 4 conversations per burst slot
        ("<slot>/0".."<slot>/3"); the chain's bursts run on the 10-turn ones."""
        session_type, _ = peers.session_class()
        ids = self._ids("hand")
        ids.pop("burst10x4")
        subs = [f"{slot}/{i}" for slot in ids["burst10"] for i in range(TURNS_EACH)]
        big = [f"stored-1000-{n}" for n in range(_rounds() + 1)]

        async def populate() -> None:
            client = aioredis.Redis.from_url(self.urls["hand"])
            try:
                ten = [c for cids in ids.values() for c in cids] + subs
                for size, group in [(10, ten), (1_000, big)]:
                    sessions = [session_type(c, redis_client=client, key_prefix=peers.HAND_PREFIX)
                                for c in group]  # fmt: skip
                    step = _CONCURRENT_TURNS // size or 1
                    for first in range(0, len(sessions), step):
                        await asyncio.gather(
                            *(populate_session(s, size) for s in sessions[first : first + step])
                        )
            finally:
                await client.aclose()

        asyncio.run(populate())
        for purpose, cids in ids.items():
            self.stored.pools["hand", purpose] = cids
        self.stored.pools["chain", "burst10"] = list(ids["burst10"])
        self.h1000["hand"] = big


def _remote(factory: str, *args: Any) -> Any:
    """A :class:`Remote` as a context manager (closed with the stack)."""
    import contextlib

    @contextlib.contextmanager
    def managed() -> Any:
        remote = Remote(factory, *args)
        try:
            yield remote
        finally:
            remote.close()

    return managed()


# -- measurements ----------------------------------------------------------------------------
def _cids(setup: Setup, system: str, stored: int, n: int, round_number: int) -> list[Any]:
    if stored == 0 or system == "bare":  # a bare task keeps no history
        return [None] * n
    if stored == STORED[0]:
        return setup.stored.take(system, "e2e10", n)
    return [setup.h1000[system][round_number + 1]] * n


def _end_to_end(setup: Setup, table: Table) -> None:
    cells = [(row, key) for row in E2E_ROWS for key in row[4]]
    for (_, _, kind, stored, _), key in cells:  # warm-up: connections, imports, threads
        setup.sides[key].call("turns", kind, _cids(setup, key, stored, WARM_UP // 2, -1))
    for n in range(_rounds()):
        for (row_key, title, kind, stored, _), key in rotated(cells, n):
            worker = setup.workers[key]
            cpu = process_cpu_s(worker.pid)
            ms = setup.sides[key].call("turns", kind, _cids(setup, key, stored, _per_round(), n))
            cpu = process_cpu_s(worker.pid) - cpu
            table.add(f"{row_key}-{key}", SECTION_E2E, f"{title}: {NAMES[key]}", "ms",
                      statistics.median(ms))  # fmt: skip
            if stored == STORED[0] and kind == "ok":
                table.add(f"cpu1-{key}", SECTION_E2E,
                          f"worker CPU per turn, one at a time (10 stored turns): {NAMES[key]}",
                          "ms", cpu / _per_round() * 1000)  # fmt: skip
    for row_key, title, _, _, keys in E2E_ROWS:
        base = "new-bare" if row_key == "newsync" else f"{row_key}-bare"
        if "bare" in keys or row_key == "newsync":
            table.ratio(f"{title}: convoq / bare Celery", f"{row_key}-convoq", base)
        if "hand" in keys:
            table.ratio(f"{title}: convoq / hand-built", f"{row_key}-convoq", f"{row_key}-hand")
    table.ratio("worker CPU per turn, one at a time: convoq / hand-built", "cpu1-convoq",
                "cpu1-hand")  # fmt: skip


def _bursts(setup: Setup, table: Table) -> None:
    cells = [(burst, key) for burst in BURSTS for key in burst[4]]
    turns = CONVERSATIONS * TURNS_EACH
    for (_, _, kind, stored, _), key in cells:  # warm-up: the threads, their connections
        setup.sides[key].call("burst", kind, _burst_ids(setup, key, stored))
    for n in range(_burst_rounds()):
        for (bkey, title, kind, stored, _), key in rotated(cells, n):
            worker = setup.workers[key]
            cpu = process_cpu_s(worker.pid)
            seconds = setup.sides[key].call("burst", kind, _burst_ids(setup, key, stored))
            cpu = process_cpu_s(worker.pid) - cpu
            table.add(f"{bkey}-{key}", SECTION_BURST, f"turns/s, {title}: {NAMES[key]}", "/s",
                      turns / seconds)  # fmt: skip
            table.add(f"cpu-{bkey}-{key}", SECTION_BURST,
                      f"worker CPU per turn, {title}: {NAMES[key]}", "ms",
                      cpu / turns * 1000)  # fmt: skip
    for bkey, title, _, _, keys in BURSTS:
        for peer in ("chain", "bare"):
            if peer in keys:
                table.ratio(f"burst, {title}: convoq / {NAMES[peer]}", f"{bkey}-convoq",
                            f"{bkey}-{peer}")  # fmt: skip
    table.ratio("burst: convoq off / on", "burst-off", "burst-convoq")
    table.ratio("burst: convoq, 300-byte reply / ok", "burst300-convoq", "burst-convoq")
    table.ratio("worker CPU per turn, burst: convoq / hand-built chain", "cpu-burst-convoq",
                "cpu-burst-chain")  # fmt: skip


def _burst_ids(setup: Setup, system: str, stored: int) -> list[Any]:
    if stored == 0 or system == "bare":  # a bare task keeps no history
        return [None] * CONVERSATIONS
    return setup.stored.take(system, "burst10", CONVERSATIONS)


def _commands(setup: Setup, table: Table) -> None:
    cells = [(key, stored) for key in ("convoq", "off", "bare", "hand") for stored in (0, 10)
             if not (key == "bare" and stored)]  # fmt: skip
    servers = {key: redis.Redis.from_url(setup.urls[key]) for key in ("convoq", "off", "bare",
                                                                       "hand")}  # fmt: skip
    try:
        for n in range(2):
            for key, stored in rotated(cells, n):
                cids = setup.stored.take(key, "cmds10", 30) if stored else [None] * 30
                run = functools.partial(setup.sides[key].call, "turns", "ok", cids)
                with _sweeper_held(servers[key], setup.prefixes.get(key)):
                    per_turn = _commands_per_turn(servers[key], run, 30)
                where = "a conversation of 10 stored turns" if stored else "a new conversation"
                table.add(f"cmds{stored or ''}-{key}", SECTION_COST,
                          f"Redis commands per turn on {where}: {NAMES[key]}", "",
                          sum(per_turn.values()))  # fmt: skip
    finally:
        for server in servers.values():
            server.close()


@contextmanager
def _sweeper_held(r: redis.Redis, prefix: str | None) -> Iterator[None]:
    """convoq's sweeper kept from its pass while the block counts commands (its lock held
    under another token): a pass is a deployment's periodic cost (a SCAN of the keyspace,
    every 5 s), not a turn's, and one that fell inside a window of 30 turns put its whole
    cost on those turns (36.05 a turn in one round, 34.98 in the next, when it fell in the
    idle second subtracted instead). Its attempt to take the lock stays in the count."""
    if prefix is None:  # a peer: no sweeper
        yield
        return
    lock = KeySchema(prefix).sweeper_lock()
    r.set(lock, "bench", px=60_000)
    try:
        yield
    finally:
        r.delete(lock)


def _calls(r: redis.Redis) -> Counter[str]:
    stats = r.info("commandstats")
    return Counter(
        {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if "calls" in v}
    )


def _commands_per_turn(r: redis.Redis, run: Callable[[], object], turns: int) -> Counter[str]:
    """Commands per turn by name on ``r``'s server while ``run()`` runs ``turns`` turns,
    less what its idle clients (pollers, the sweeper) sent in as long, measured over one
    second just before."""
    r.config_resetstat()
    idle_started = time.perf_counter()
    time.sleep(1.0)
    idle = _calls(r)
    idle_seconds = time.perf_counter() - idle_started
    r.config_resetstat()
    started = time.perf_counter()
    run()
    elapsed = time.perf_counter() - started
    busy = _calls(r)
    busy.subtract({k: v * elapsed / idle_seconds for k, v in idle.items()})
    own = ("info", "config|resetstat", "config")
    return Counter({k: v / turns for k, v in busy.items() if v > 0 and k not in own})


def run(home: Path, table: Table) -> None:
    """Start the queued systems (servers, workers, populated histories, client sides),
    measure, stop."""
    with ExitStack() as stack:
        setup = Setup(stack, home)
        try:
            _end_to_end(setup, table)
            _bursts(setup, table)
            _commands(setup, table)
        finally:
            fast_paths_mode(None)
            os.environ.pop("CONVOQ_FAST_PATHS", None)

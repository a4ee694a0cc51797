"""The memory rows of :mod:`bench.compare`: whole-history loads and windows of the last 10
turns, convoq against RedisSession and langchain, each system on its own private
redis-server with no worker running, every history populated first, and each system's
reads in a process of its own (:mod:`bench._procs`), the systems alternating round by
round; and a ``RedisConversationMemory`` made from a URL against the same memory given a
client.

convoq's reads, each a system (a process) of its own:

- ``convoq``: typed loads as a process makes them by default, which keeps the stored
  turns it decoded (``CONVOQ_DECODED_CACHE_BYTES``): every load after the first of a
  history decodes nothing;
- ``convoq, decoding each time``: ``CONVOQ_DECODED_CACHE_BYTES=0``, every load decodes;
- ``convoq, stored JSON``: ``aload_json``, the reads that only forward a history;
- ``convoq, fast paths off``: ``CONVOQ_FAST_PATHS=off`` (and decoding each time).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from bench import peers
from bench._harness import fast_paths_mode, for_rounds, redis_server, rotated
from bench._procs import Remote
from bench.compare import FULL_SIZES, Table
from bench.memory_append import a_turn
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import MessageList
from convoq.redis import connect

SECTION = "memory (no workers; a server per system, each system's reads in a process of its own)"
WINDOW_SIZES = (10, 1_000, 10_000)  # stored turns of the window loads
WINDOW = 10
HOP_TURNS = 50  # stored turns of the URL-vs-client conversations
BATCH = 250


def _items(n: int) -> list[dict[str, str]]:
    user, assistant = a_turn(n)
    return [
        {"role": "user", "content": user.text},
        {"role": "assistant", "content": assistant.text},
    ]


def _langchain_dict(role: str, text: str) -> dict[str, Any]:
    """What langchain's ``message_to_dict`` stores for a plain human or ai message."""
    data = {"content": text, "additional_kwargs": {}, "response_metadata": {}, "type": role,
            "name": None, "id": None}  # fmt: skip
    if role == "ai":
        data.update(tool_calls=[], invalid_tool_calls=[], usage_metadata=None)
    return {"type": role, "data": data}


async def populate_convoq(memory: RedisConversationMemory, cid: str, turns: int) -> None:
    for first in range(0, turns, BATCH):
        batch = range(first, min(first + BATCH, turns))
        await asyncio.gather(*(memory.aappend(cid, a_turn(n)) for n in batch))


async def populate_session(session: Any, turns: int) -> None:
    for first in range(0, turns, BATCH):
        await session.add_items(
            [i for n in range(first, min(first + BATCH, turns)) for i in _items(n)]
        )


def _populate_langchain(url: str, cid: str, turns: int) -> None:
    """langchain's own format (LPUSH of message_to_dict JSON, newest first), pipelined."""
    client = redis.Redis.from_url(url)
    with client.pipeline(transaction=False) as pipe:
        for n in range(turns):
            user, assistant = a_turn(n)
            for role, said in (("human", user.text), ("ai", assistant.text)):
                pipe.lpush(f"message_store:{cid}", json.dumps(_langchain_dict(role, said)))
        pipe.execute()
    client.close()


# -- the systems, each built in its own process --------------------------------------------
class _Timed:
    """A process's own event loop, and the median ms of ``n`` calls of an operation."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.ops: dict[str, Callable[[str], Awaitable[object]]] = {}
        self.sync_ops: dict[str, Callable[[str], object]] = {}

    def time(self, op: str, cid: str, n: int) -> float:
        times = []
        for _ in range(n):
            started = time.perf_counter()
            if op in self.sync_ops:
                self.sync_ops[op](cid)
            else:
                self.loop.run_until_complete(self.ops[op](cid))
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)

    def close(self) -> None:
        self.loop.close()


class ConvoqReads(_Timed):
    """convoq's reads on ``url`` with ``env`` set first (``CONVOQ_FAST_PATHS``,
    ``CONVOQ_DECODED_CACHE_BYTES``)."""

    def __init__(self, url: str, env: dict[str, str]) -> None:
        super().__init__()
        os.environ.update(env)
        self.memory = RedisConversationMemory(client=connect(url), prefix="bench")
        self.from_url = RedisConversationMemory(url, prefix="bench")
        self.blocking = RedisConversationMemory(url, prefix="bench")  # sync calls: own pool
        self.raw: dict[str, bytes] = {}
        turns = iter(range(10**9))
        memory, blocking = self.memory, self.blocking
        self.ops = {
            "full": memory.aload,
            "json": memory.aload_json,
            "window": lambda cid: memory.aload(cid, last_turns=WINDOW),
            "append-client": lambda cid: memory.aappend(cid, a_turn(-next(turns))),
            "append-url": lambda cid: self.from_url.aappend(cid, a_turn(-next(turns))),
            "window-url": lambda cid: self.from_url.aload(cid, last_turns=WINDOW),
            "validate": self._validate,
        }
        self.sync_ops = {"window-sync": lambda cid: blocking.load(cid, last_turns=WINDOW)}

    async def _validate(self, cid: str) -> object:
        """pydantic validating the messages' JSON from bytes in memory (no Redis at all):
        the floor of any decode into ``Message`` objects."""
        if cid not in self.raw:
            self.raw[cid] = await self.memory.aload_json(cid)
        return MessageList.validate_json(self.raw[cid])

    def close(self) -> None:
        for memory in (self.memory, self.from_url):
            self.loop.run_until_complete(memory.aclose())
        self.blocking.close()
        super().close()


class SessionReads(_Timed):
    """OpenAI Agents' RedisSession (or its re-creation) on ``url``."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.session_type, self.name = peers.session_class()
        self.client = aioredis.Redis.from_url(url)
        sessions: dict[str, Any] = {}

        def session(cid: str) -> Any:
            if cid not in sessions:
                sessions[cid] = self.session_type(
                    cid, redis_client=self.client, key_prefix="bench:session"
                )
            return sessions[cid]

        self.ops = {
            "full": lambda cid: session(cid).get_items(),
            "window": lambda cid: session(cid).get_items(limit=2 * WINDOW),
        }

    def label(self) -> str:
        return str(self.name)

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        super().close()


class LangchainReads(_Timed):
    """langchain's RedisChatMessageHistory.messages, or its commands re-created (LRANGE
    0 -1, json.loads per item, newest first reversed) when it is not installed."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        try:
            from langchain_community.chat_message_histories import RedisChatMessageHistory
        except ImportError:
            client = redis.Redis.from_url(url)

            def recreated(cid: str) -> object:
                raw = client.lrange(f"message_store:{cid}", 0, -1)
                return [json.loads(m.decode("utf-8")) for m in raw[::-1]]

            self.sync_ops = {"full": recreated}
            self.name = "langchain (re-created: not installed)"
            return
        self.sync_ops = {"full": lambda cid: RedisChatMessageHistory(cid, url=url).messages}
        self.name = "langchain"

    def label(self) -> str:
        return self.name


# -- the measurement -----------------------------------------------------------------------
READERS = {
    # key: (factory, its server, what it is called, its environment)
    "convoq": ("ConvoqReads", "convoq", "convoq", {}),
    "cold": ("ConvoqReads", "convoq", "convoq, decoding each time",
             {"CONVOQ_DECODED_CACHE_BYTES": "0"}),
    "json": ("ConvoqReads", "convoq", "convoq, stored JSON (aload_json)", {}),
    "off": ("ConvoqReads", "off", "convoq, fast paths off",
            {"CONVOQ_FAST_PATHS": "off", "CONVOQ_DECODED_CACHE_BYTES": "0"}),
    "session": ("SessionReads", "session", "", {}),
    "langchain": ("LangchainReads", "langchain", "", {}),
}  # fmt: skip


def _start(urls: dict[str, str], stack: ExitStack) -> tuple[dict[str, Remote], dict[str, str]]:
    remotes: dict[str, Remote] = {}
    names: dict[str, str] = {}
    for key, (factory, server, name, env) in READERS.items():
        args: tuple[Any, ...] = (urls[server], env) if factory == "ConvoqReads" else (urls[server],)
        remote = Remote(f"bench.compare_memory.{factory}", *args)
        stack.callback(remote.close)
        remotes[key] = remote
        names[key] = name or remote.call("label")
    return remotes, names


def _alternating(
    remotes: dict[str, Remote], cells: list[tuple[str, str, str]], rounds: int, n: int
) -> dict[tuple[str, str, str], list[float]]:
    """Round medians (ms) per (system, op, cid); within a round the cells take turns,
    the first one rotating."""
    medians: dict[tuple[str, str, str], list[float]] = {cell: [] for cell in cells}
    for r in range(rounds):
        for cell in rotated(cells, r):
            system, op, cid = cell
            medians[cell].append(remotes[system].call("time", op, cid, n))
    return medians


def _full_loads(remotes: dict[str, Remote], names: dict[str, str], table: Table) -> None:
    systems = ("convoq", "cold", "json", "off", "session", "langchain")
    for size in FULL_SIZES:
        cid = f"full-{size}"
        cells = [(s, "json" if s == "json" else "full", cid) for s in systems]
        cells.append(("convoq", "validate", cid))
        for system in ("convoq", "cold", "json"):  # the first read of each, untimed
            remotes[system].call("time", "json" if system == "json" else "full", cid, 1)
        per_round = 10 if size < 10_000 else 3
        medians = _alternating(remotes, cells, for_rounds(9, 3), per_round)
        for (system, op, _), values in medians.items():
            key = "validate" if op == "validate" else system
            name = "validate_json alone of those messages" if op == "validate" else names[system]
            for value in values:
                table.add(f"full{size}-{key}", SECTION, f"full load of {size:,} turns: {name}",
                          "ms", value)  # fmt: skip
        for system in ("convoq", "json", "cold"):
            table.ratio(f"full load {size:,}: {names[system]} / RedisSession",
                        f"full{size}-{system}", f"full{size}-session")  # fmt: skip
        table.ratio(f"full load {size:,}: validate_json alone / RedisSession",
                    f"full{size}-validate", f"full{size}-session")  # fmt: skip


def _windows(remotes: dict[str, Remote], names: dict[str, str], table: Table) -> None:
    what = {"convoq": "convoq async", "sync": "convoq sync", "cold": "convoq async, decoding"
            " each time", "session": names["session"]}  # fmt: skip
    for size in WINDOW_SIZES:
        cid = f"window-{size}"
        cells = [("convoq", "window", cid), ("convoq", "window-sync", cid),
                 ("cold", "window", cid), ("session", "window", cid)]  # fmt: skip
        medians = _alternating(remotes, cells, for_rounds(10, 4), 50)
        for (system, op, _), values in medians.items():
            key = "sync" if op == "window-sync" else system
            for value in values:
                table.add(f"win{size}-{key}", SECTION,
                          f"last {WINDOW} turns of {size:,}: {what[key]}", "ms", value)  # fmt: skip


def _url_or_client(remotes: dict[str, Remote], table: Table) -> None:
    what = {"url": "made from a URL", "client": "given a client"}
    for op in ("append", "load-10"):
        cells = [
            ("convoq", f"append-{name}" if op == "append" else
             ("window-url" if name == "url" else "window"), f"hop-{name}")
            for name in ("url", "client")
        ]  # fmt: skip
        medians = _alternating(remotes, cells, for_rounds(10, 4), 50)
        for (_, _, cid), values in medians.items():
            name = cid.removeprefix("hop-")
            for value in values:
                table.add(f"{op}-{name}", SECTION, f"memory {what[name]}: async {op}", "ms",
                          value)  # fmt: skip


async def _populate(urls: dict[str, str]) -> None:
    session_type, _ = peers.session_class()
    memories = {}
    for server, mode in (("convoq", "on"), ("off", "off")):
        fast_paths_mode(mode)
        memories[server] = RedisConversationMemory(client=connect(urls[server]), prefix="bench")
    fast_paths_mode(None)
    session_client = aioredis.Redis.from_url(urls["session"])
    try:
        sizes = {f"full-{size}": size for size in FULL_SIZES}
        sizes.update({f"window-{size}": size for size in WINDOW_SIZES})
        for cid, size in sizes.items():
            for server, memory in memories.items():
                fast_paths_mode("off" if server == "off" else "on")
                await populate_convoq(memory, cid, size)
            fast_paths_mode(None)
            session = session_type(cid, redis_client=session_client, key_prefix="bench:session")
            await populate_session(session, size)
            if cid.startswith("full-"):
                _populate_langchain(urls["langchain"], cid, size)
        for name in ("url", "client"):
            await populate_convoq(memories["convoq"], f"hop-{name}", HOP_TURNS)
    finally:
        for memory in memories.values():
            await memory.aclose()
        await session_client.aclose()


def run(home: Path, table: Table) -> None:
    """Start the memory systems' servers, populate them, measure each system's reads in a
    process of its own, stop them."""
    with ExitStack() as stack:
        urls = {
            name: stack.enter_context(redis_server(home / name))
            for name in ("convoq", "off", "session", "langchain")
        }
        asyncio.run(_populate(urls))
        remotes, names = _start(urls, stack)
        _full_loads(remotes, names, table)
        _windows(remotes, names, table)
        _url_or_client(remotes, table)

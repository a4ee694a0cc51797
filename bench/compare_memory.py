"""The memory rows of :mod:`bench.compare`: whole-history loads of convoq (fast paths on
and off), RedisSession and langchain, each on its own private redis-server with no worker
running, every history populated first; and a ``RedisConversationMemory`` made from a URL
against the same memory given a client (both convoq's, on convoq's server)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from bench import peers
from bench._harness import alternating_ms, fast_paths_mode, for_rounds, redis_server
from bench.compare import FULL_SIZES, Table
from bench.memory_append import a_turn
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import MessageList
from convoq.redis import connect

SECTION = "memory (no workers; a server per system)"
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


def _langchain_load(url: str, cid: str) -> tuple[Callable[[], object], str]:
    """langchain's RedisChatMessageHistory.messages, or its commands re-created (LRANGE
    0 -1, json.loads per item, newest first reversed) when it is not installed."""
    try:
        from langchain_community.chat_message_histories import RedisChatMessageHistory
    except ImportError:
        client = redis.Redis.from_url(url)

        def recreated() -> object:
            raw = client.lrange(f"message_store:{cid}", 0, -1)
            return [json.loads(m.decode("utf-8")) for m in raw[::-1]]

        return recreated, "langchain (re-created: not installed)"
    history = RedisChatMessageHistory(cid, url=url)
    return (lambda: history.messages), "langchain"


def _in_mode(mode: str, call: Callable[[], Awaitable[object]]) -> Callable[[], Awaitable[object]]:
    """``call`` with this process's fast-paths switch set to ``mode`` first (convoq reads
    it when it builds a client and per connection)."""

    async def wrapped() -> object:
        fast_paths_mode(mode)
        return await call()

    return wrapped


async def _measure(urls: dict[str, str], table: Table) -> None:
    session_type, session_name = peers.session_class()
    fast_paths_mode("on")
    convoq = RedisConversationMemory(client=connect(urls["convoq"]), prefix="bench")
    from_url = RedisConversationMemory(urls["convoq"], prefix="bench")
    fast_paths_mode("off")
    off = RedisConversationMemory(client=connect(urls["off"]), prefix="bench")
    fast_paths_mode("on")
    session_client = aioredis.Redis.from_url(urls["session"])
    try:
        for size in FULL_SIZES:  # every history before anything is timed
            cid = f"full-{size}"
            await populate_convoq(convoq, cid, size)
            fast_paths_mode("off")
            await populate_convoq(off, cid, size)
            fast_paths_mode("on")
            await populate_session(session_type(cid, redis_client=session_client,
                                                key_prefix="bench:session"), size)  # fmt: skip
            _populate_langchain(urls["langchain"], cid, size)
        for name in ("url", "client"):
            await populate_convoq(convoq, f"hop-{name}", HOP_TURNS)
        for size in FULL_SIZES:
            cid = f"full-{size}"
            assert len(await convoq.aload(cid)) == 2 * size
            session = session_type(cid, redis_client=session_client, key_prefix="bench:session")
            langchain_load, langchain_name = _langchain_load(urls["langchain"], cid)
            # The floor of any load that returns Message objects: pydantic's validation of
            # the same messages' JSON from bytes already in memory (no Redis at all).
            raw = MessageList.dump_json(await convoq.aload(cid))

            async def validate_only(raw: bytes = raw) -> object:
                return MessageList.validate_json(raw)

            async def langchain(load: Callable[[], object] = langchain_load) -> object:
                return load()

            calls = {
                "convoq": _in_mode("on", lambda c=cid: convoq.aload(c)),  # type: ignore[misc]
                "off": _in_mode("off", lambda c=cid: off.aload(c)),  # type: ignore[misc]
                "session": session.get_items,
                "langchain": langchain,
                "validate": validate_only,
            }
            names = {"convoq": "convoq", "off": "convoq, fast paths off",
                     "session": session_name, "langchain": langchain_name,
                     "validate": "validate_json alone of those messages"}  # fmt: skip
            per_round = 10 if size < 10_000 else 3
            medians = await alternating_ms(for_rounds(9, 3), per_round, calls)
            for key, values in medians.items():
                what = f"full load of {size:,} turns: {names[key]}"
                for value in values:
                    table.add(f"full{size}-{key}", SECTION, what, "ms", value)
            table.ratio(f"full load {size:,}: convoq off / on", f"full{size}-off",
                        f"full{size}-convoq")  # fmt: skip
            table.ratio(f"full load {size:,}: validate_json alone / RedisSession",
                        f"full{size}-validate", f"full{size}-session")  # fmt: skip
        fast_paths_mode("on")  # the last timed call may have been the off memory's
        await _url_or_client(from_url, convoq, table)
    finally:
        fast_paths_mode(None)
        await convoq.aclose()
        await from_url.aclose()
        await off.aclose()
        await session_client.aclose()


async def _url_or_client(
    from_url: RedisConversationMemory, given: RedisConversationMemory, table: Table
) -> None:
    counter = iter(range(10**9))
    memories = {"url": from_url, "client": given}
    what = {"url": "made from a URL", "client": "given a client"}
    for op in ("append", "load-10"):
        calls: dict[str, Callable[[], Awaitable[object]]] = {}
        for name, memory in memories.items():
            if op == "append":
                calls[name] = lambda m=memory, n=name: m.aappend(f"hop-{n}", a_turn(next(counter)))
            else:
                calls[name] = lambda m=memory, n=name: m.aload(f"hop-{n}", last_turns=10)
        medians = await alternating_ms(for_rounds(10, 4), 50, calls)
        for name, values in medians.items():
            for value in values:
                table.add(f"{op}-{name}", SECTION,
                          f"memory {what[name]}: async {op}", "ms", value)  # fmt: skip


def run(home: Path, table: Table) -> None:
    """Start the memory systems' servers, measure, stop them."""
    with ExitStack() as stack:
        urls = {
            name: stack.enter_context(redis_server(home / name))
            for name in ("convoq", "off", "session", "langchain")
        }
        asyncio.run(_measure(urls, table))

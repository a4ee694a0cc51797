"""ConvoqSession on a real redis-server: convoq's guarantees hold for session writes (one
writer per conversation across processes, attachments stored once, retention)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from convoq.client import AsyncClient
from convoq.errors import (
    ConversationBusyError,
    InvalidMessageError,
)
from convoq.integrations.openai_agents import ConvoqSession
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import Message
from convoq.redis.keys import KeySchema
from tests.integrations.samples import PNG, url_of

ROOT = Path(__file__).resolve().parents[2]


async def test_attachments_are_stored_once_per_conversation_on_redis(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    image = {"type": "input_image", "image_url": url_of("image/png", PNG), "detail": "low"}
    try:
        session = ConvoqSession("chat-1", memory)
        for n in range(3):
            await session.add_items(
                [
                    {"role": "user", "content": [image]},
                    {"role": "assistant", "content": f"seen {n}"},
                ]
            )
        blobs = redis_client.hgetall(KeySchema(key_prefix).blobs("chat-1"))
        assert list(blobs.values()) == [PNG]
        assert len(await session.get_items()) == 6
    finally:
        await memory.aclose()


async def test_a_running_convoq_turn_keeps_writes_out(redis_url: str, key_prefix: str) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    other = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        # Another process's turn (an Agent, a worker) holds the conversation's lease.
        await other.areserve("chat-1", "a-running-turn")
        session = ConvoqSession("chat-1", memory, busy_timeout_s=0)
        with pytest.raises(ConversationBusyError):
            await session.add_items([{"role": "user", "content": "too early"}])
        with pytest.raises(ConversationBusyError):
            await session.pop_item()
        await other.acommit_turn("chat-1", "a-running-turn", [Message.user("the turn")])
        await session.add_items([{"role": "user", "content": "after it"}])
        assert await session.get_items() == [
            {"role": "user", "content": "the turn"},
            {"role": "user", "content": "after it"},
        ]
    finally:
        await memory.aclose()
        await other.aclose()


async def test_retention_applies_to_session_writes(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix, conversation_ttl_s=3600)
    try:
        await ConvoqSession("chat-1", memory).add_items([{"role": "user", "content": "hi"}])
        ttl = redis_client.pttl(KeySchema(key_prefix).turns("chat-1"))
        assert 0 < ttl <= 3_600_000
    finally:
        await memory.aclose()


WRITES_DRIVER = ROOT / "tests" / "support" / "agents_session_writes.py"


def test_two_processes_writing_one_session_interleave_whole_batches(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOQ_")}
    env["PYTHONPATH"] = str(ROOT)
    writers = [
        subprocess.Popen(
            [
                sys.executable,
                str(WRITES_DRIVER),
                redis_url,
                key_prefix,
                "shared",
                tag,
                "15",
                str(go),
            ],
            env=env,
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("a", "b")
    ]
    go.touch()
    for writer in writers:
        _, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err[-3000:]
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        items = asyncio.run(ConvoqSession("shared", memory).get_items())
    finally:
        memory.close()
    assert len(items) == 60
    # Every batch is stored whole: a user item is always followed by its own answer.
    for asked, answered in zip(items[::2], items[1::2], strict=True):
        assert answered == {"role": "assistant", "content": f"{asked['content']} answered"}
    for tag in ("a", "b"):
        mine = [i["content"] for i in items[::2] if i["content"].startswith(f"{tag}-")]
        assert mine == [f"{tag}-{n}" for n in range(15)]


def test_without_a_memory_it_uses_redis_from_the_settings(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVOQ_REDIS_URL", redis_url)
    monkeypatch.setenv("CONVOQ_PREFIX", key_prefix)
    session = ConvoqSession("chat-1")
    asyncio.run(session.add_items([{"role": "user", "content": "hi"}]))
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        assert memory.load("chat-1") == [Message.user("hi")]
    finally:
        memory.close()
        assert isinstance(session.memory, RedisConversationMemory)
        session.memory.close()


async def test_clear_session_is_refused_while_a_turn_runs(redis_url: str, key_prefix: str) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        session = ConvoqSession("chat-1", memory)
        await session.add_items([{"role": "user", "content": "kept"}])
        await memory.areserve("chat-1", "a-running-turn")
        with pytest.raises(ConversationBusyError):
            await session.clear_session()
        await memory.arelease("chat-1", "a-running-turn")
        assert await session.get_items() == [{"role": "user", "content": "kept"}]
        await session.clear_session()
        assert await session.get_items() == []
    finally:
        await memory.aclose()


async def test_a_queued_worker_turn_keeps_writes_and_pops_out(
    redis_url: str, key_prefix: str
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    session = ConvoqSession("chat-1", memory, busy_timeout_s=0)
    try:
        await session.add_items([{"role": "user", "content": "kept"}])
        # No worker runs: the submitted turn stays queued in the conversation's inbox.
        async with AsyncClient(redis_url, prefix=key_prefix, agents=["echo"]) as client:
            handle = await client.submit("chat-1", "a queued turn", agent="echo")
            assert await handle.status() == "queued"
            for write in (
                session.add_items([{"role": "user", "content": "too early"}]),
                session.pop_item(),
                session.clear_session(),
            ):
                with pytest.raises(ConversationBusyError):
                    await write
            await client.cancel(handle)
        assert await session.get_items() == [{"role": "user", "content": "kept"}]
    finally:
        await memory.aclose()


async def test_a_refused_write_stores_nothing_and_frees_the_conversation(
    redis_url: str, key_prefix: str
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix, max_turn_bytes=4096)
    try:
        session = ConvoqSession("chat-1", memory, busy_timeout_s=0)
        await session.add_items([{"role": "user", "content": "kept"}])
        with pytest.raises(InvalidMessageError):
            await session.add_items([{"role": "user", "content": "x" * 10_000}])
        # The refused write held the conversation's lease; it is free again at once.
        await session.add_items([{"role": "assistant", "content": "next"}])
        assert await session.get_items() == [
            {"role": "user", "content": "kept"},
            {"role": "assistant", "content": "next"},
        ]
    finally:
        await memory.aclose()

"""What is particular to RedisConversationMemory: its layout, windowed loads that match the
shared window rules for any sequence of appends, and its connection handling."""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from convoq._sync import run_sync
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import ImagePart, Message, MessageRole, TextPart
from convoq.redis import KeySchema, _history, embedded
from convoq.window import last_turns
from tests.support.redis_server import RedisServer

CID = "mem"


@pytest.fixture
async def memory(redis_url: str, key_prefix: str) -> AsyncIterator[RedisConversationMemory]:
    mem = RedisConversationMemory(redis_url, prefix=key_prefix)
    yield mem
    await mem.aclose()


def said(role: MessageRole, text: str) -> Message:
    return Message(role=role, content=[TextPart(text=text)])


async def test_leading_messages_are_kept_apart_and_come_with_any_window(
    memory: RedisConversationMemory, redis_client: redis.Redis, key_prefix: str
) -> None:
    keys = KeySchema(key_prefix)
    lead = [Message.system("be brief"), said(MessageRole.DEVELOPER, "json only")]
    await memory.aappend(CID, [*lead, Message.user("q1"), Message.assistant("a1")])
    for n in (2, 3):
        await memory.aappend(CID, [Message.user(f"q{n}"), Message.assistant(f"a{n}")])
    assert redis_client.llen(keys.lead(CID)) == 1
    assert redis_client.llen(keys.turns(CID)) == 3
    assert redis_client.hget(keys.meta(CID), "turns") == b"3"
    window = await memory.aload(CID, last_turns=1)
    assert window == [*lead, Message.user("q3"), Message.assistant("a3")]


async def test_messages_that_do_not_start_a_turn_continue_the_last_one(
    memory: RedisConversationMemory,
) -> None:
    await memory.aappend(CID, [Message.user("q1")])
    await memory.aappend(CID, [Message.assistant("a1")])
    await memory.aappend(
        CID, [Message.system("note"), Message.assistant("a1b"), Message.user("q2")]
    )
    assert [m.text for m in await memory.aload(CID, last_turns=1)] == ["q2"]
    assert [m.text for m in await memory.aload(CID, last_turns=2)] == [
        "q1",
        "a1",
        "note",
        "a1b",
        "q2",
    ]


_ROLES = st.sampled_from(list(MessageRole))
_BATCH = st.lists(st.tuples(_ROLES, st.booleans()), min_size=1, max_size=4)


@settings(max_examples=25, deadline=None)
@given(batches=st.lists(_BATCH, min_size=1, max_size=6))
def test_windowed_loads_match_the_window_rules_for_any_appends(
    redis_server: RedisServer, batches: list[list[tuple[MessageRole, bool]]]
) -> None:
    memory = RedisConversationMemory(redis_server.url, prefix=f"h{uuid.uuid4().hex[:10]}")
    everything: list[Message] = []
    try:
        for b, batch in enumerate(batches):
            messages = []
            for i, (role, picture) in enumerate(batch):
                content: list[TextPart | ImagePart] = [TextPart(text=f"{b}.{i}")]
                if picture:
                    content.append(ImagePart(data=bytes([b, i]) * 50, mime_type="x/y"))
                messages.append(Message(role=role, content=content))
            memory.append(CID, messages)
            everything += messages
        assert memory.load(CID) == everything
        for keep in range(1, len(everything) + 2):
            assert memory.load(CID, last_turns=keep) == last_turns(everything, keep)
            # The async read is not trimmed again after it: it must be exact by itself.
            assert run_sync(memory.aload(CID, last_turns=keep)) == last_turns(everything, keep)
    finally:
        memory.clear(CID)
        memory.close()


async def test_same_attachment_is_stored_once(
    memory: RedisConversationMemory, redis_client: redis.Redis, key_prefix: str
) -> None:
    picture = ImagePart(data=b"\x89PNG" + bytes(range(256)), mime_type="image/png")
    for n in range(3):
        await memory.aappend(CID, [Message(content=[TextPart(text=str(n)), picture])])
    assert redis_client.hlen(KeySchema(key_prefix).blobs(CID)) == 1
    loaded = await memory.aload(CID)
    assert all(m.content[1] == picture for m in loaded)


async def test_sync_and_async_calls_share_one_pool_from_any_loop(
    memory: RedisConversationMemory,
) -> None:
    await asyncio.to_thread(memory.append, CID, [Message.user("from a thread")])
    await asyncio.gather(*(memory.aappend(CID, [Message.user(f"c{n}")]) for n in range(20)))
    loaded = await memory.aload(CID)
    assert len(loaded) == 21
    assert {m.text for m in loaded} == {"from a thread", *(f"c{n}" for n in range(20))}


def test_a_memory_dropped_without_close_leaves_no_open_socket(redis_url: str) -> None:
    memory = RedisConversationMemory(redis_url, prefix=f"g{uuid.uuid4().hex[:10]}")
    memory.append(CID, [Message.user("x")])
    assert memory.load(CID) == [Message.user("x")]
    memory.clear(CID)
    del memory
    gc.collect()  # an unclosed socket would surface here as a ResourceWarning (an error)


async def test_without_a_url_the_embedded_server_is_used(tmp_path: Path) -> None:
    home = tmp_path / "home"
    memory = RedisConversationMemory(prefix="emb", home=home)
    try:
        await memory.aappend(CID, [Message.user("kept"), Message.assistant("yes")])
        assert embedded.running_url(home) is not None
        assert [m.text for m in await memory.aload(CID)] == ["kept", "yes"]
    finally:
        await memory.aclose()
        embedded.stop(home)


async def test_sync_and_async_reads_agree_also_when_read_in_chunks(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tiny chunks: a history of a few turns takes the chunked path of both flavours.
    monkeypatch.setattr(_history, "CHUNK", 3)
    monkeypatch.setattr(_history, "_BLOB_CHUNK", 2)
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    turns = [
        [
            Message(
                content=[
                    TextPart(text=f"turn {n}"),
                    ImagePart(data=bytes([n]) * 64, mime_type="image/png"),
                ]
            ),
            Message.assistant(f"answer {n}"),
        ]
        for n in range(8)
    ]
    memory.append(CID, [said(MessageRole.SYSTEM, "be brief")])
    for n, turn in enumerate(turns):
        if n % 2:
            memory.append(CID, turn)
        else:
            await memory.aappend(CID, turn)
    everything = [said(MessageRole.SYSTEM, "be brief"), *(m for t in turns for m in t)]
    for window in (None, 2, 5):
        expected = last_turns(everything, window)
        assert memory.load(CID, last_turns=window) == expected
        assert await memory.aload(CID, last_turns=window) == expected
    await memory.aclose()

"""What is particular to RedisConversationMemory: its layout, windowed loads that match the
shared window rules for any sequence of appends, and its connection handling."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
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


# -- a memory made from a URL: a pool per event loop ------------------------------------------
def _named(redis_url: str) -> tuple[str, str]:
    """The URL with a client name of its own, and that name: CLIENT LIST then shows exactly
    the connections the memory has open."""
    name = f"m{uuid.uuid4().hex[:10]}"
    return f"{redis_url}{'&' if '?' in redis_url else '?'}client_name={name}", name


def _open(redis_client: redis.Redis, name: str) -> int:
    return sum(1 for c in redis_client.client_list() if c["name"] == name)


def _eventually_none_open(redis_client: redis.Redis, name: str) -> None:
    deadline = time.monotonic() + 5
    while _open(redis_client, name) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _open(redis_client, name) == 0


def test_two_event_loops_in_turn_each_use_their_own_pool_closed_with_the_loop(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    url, name = _named(redis_url)
    memory = RedisConversationMemory(url, prefix=key_prefix)
    seen: list[tuple[asyncio.AbstractEventLoop, int]] = []

    async def a_turn_in_this_loop(n: int) -> list[str]:
        await memory.aappend(CID, [Message.user(f"q{n}"), Message.assistant(f"a{n}")])
        loaded = [m.text for m in await memory.aload(CID, last_turns=5)]
        # The pool in use is this loop's: the async call did not hop to another thread.
        assert memory._loops.loops() == [asyncio.get_running_loop()]
        seen.append((asyncio.get_running_loop(), _open(redis_client, name)))
        return loaded

    assert asyncio.run(a_turn_in_this_loop(1)) == ["q1", "a1"]
    # asyncio.run's shutdown closed that loop's pool: no connection is left open.
    assert memory._loops.loops() == []
    assert _open(redis_client, name) == 0
    assert asyncio.run(a_turn_in_this_loop(2)) == ["q1", "a1", "q2", "a2"]
    assert _open(redis_client, name) == 0
    (first, open_in_first), (second, open_in_second) = seen
    assert first is not second and open_in_first >= 1 and open_in_second >= 1
    memory.close()


def test_sync_and_async_calls_mix_from_threads_and_loops(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    url, name = _named(redis_url)
    memory = RedisConversationMemory(url, prefix=key_prefix)

    async def in_a_loop(tag: str) -> None:
        for n in range(5):
            await memory.aappend(CID, [Message.user(f"{tag}{n}")])
            # A sync call from inside a running loop still works (I/O on this thread).
            assert memory.load(CID, last_turns=1)[-1].text.startswith(("a", "b", "s"))

    def sync_calls() -> None:
        for n in range(5):
            memory.append(CID, [Message.user(f"s{n}")])

    threads = [
        threading.Thread(target=asyncio.run, args=(in_a_loop("a"),)),
        threading.Thread(target=asyncio.run, args=(in_a_loop("b"),)),
        threading.Thread(target=sync_calls),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    texts = {m.text for m in memory.load(CID)}
    assert texts == {f"{tag}{n}" for tag in "abs" for n in range(5)}
    # A method with no sync path of its own runs on the bridge loop, with that loop's pool.
    assert memory.summary(CID) is None
    assert asyncio.run(memory.aunsummarised_turns(CID)) == 15
    memory.close()
    _eventually_none_open(redis_client, name)


def test_close_closes_the_pool_of_every_loop_and_the_memory_stays_usable(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    url, name = _named(redis_url)
    memory = RedisConversationMemory(url, prefix=key_prefix)
    # A loop that keeps running on another thread while the memory is closed.
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    try:
        asyncio.run_coroutine_threadsafe(memory.aappend(CID, [Message.user("x")]), loop).result(10)
        assert memory.summary(CID) is None  # the bridge loop's pool
        memory.load(CID)  # the sync pool
        assert len(memory._loops.loops()) == 2
        assert _open(redis_client, name) >= 3
        memory.close()
        assert memory._loops.loops() == []
        assert _open(redis_client, name) == 0  # close waited for the other loops' closes
        # Closed is not dead: the next call opens a pool again, and aclose closes it.
        assert asyncio.run_coroutine_threadsafe(memory.aload(CID), loop).result(10) == [
            Message.user("x")
        ]
        asyncio.run_coroutine_threadsafe(memory.aclose(), loop).result(10)
        assert _open(redis_client, name) == 0
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()


async def test_aclose_closes_the_running_loops_pool_at_once(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    url, name = _named(redis_url)
    memory = RedisConversationMemory(url, prefix=key_prefix)
    await memory.aappend(CID, [Message.user("x")])
    assert await asyncio.to_thread(_open, redis_client, name) >= 1
    await memory.aclose()
    assert await asyncio.to_thread(_open, redis_client, name) == 0


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_loop_closed_without_shutdown_is_forgotten_on_the_next_call(
    redis_url: str, key_prefix: str
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(memory.aappend(CID, [Message.user("x")]))
    loop.close()  # no shutdown_asyncgens: nothing could close that loop's pool
    assert memory._loops.loops() == [loop]

    async def load() -> list[Message]:
        loaded = await memory.aload(CID)
        assert memory._loops.loops() == [asyncio.get_running_loop()]
        return loaded

    assert asyncio.run(load()) == [Message.user("x")]
    memory.close()
    del loop
    gc.collect()  # the forgotten pool's sockets go here (their warning is ignored above)


def test_a_turn_held_in_one_loop_commits_from_another(redis_url: str, key_prefix: str) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    asyncio.run(memory.areserve(CID, "turn-1"))  # its renewer ends with that loop
    turn = [Message.user("q"), Message.assistant("a")]
    asyncio.run(memory.acommit_turn(CID, "turn-1", turn))
    assert memory.load(CID) == turn
    # The lease went with the commit: another turn takes it at once.
    asyncio.run(memory.areserve(CID, "turn-2"))
    asyncio.run(memory.arelease(CID, "turn-2"))
    memory.close()


def test_an_idle_loops_pool_closes_when_that_loop_runs_again(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    url, name = _named(redis_url)
    memory = RedisConversationMemory(url, prefix=key_prefix)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(memory.aappend(CID, [Message.user("x")]))
        memory.close()  # the loop is idle: nothing can run in it now
        assert memory._loops.loops() == []
        assert _open(redis_client, name) >= 1

        async def until_closed() -> None:
            deadline = time.monotonic() + 5
            while _open(redis_client, name) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)

        loop.run_until_complete(until_closed())
        assert _open(redis_client, name) == 0
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

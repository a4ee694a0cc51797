"""Window loads by plain reads: one MULTI/EXEC of HGET + LRANGE + LRANGE on a kept
connection, no script, falling back to the ``load`` script where plain reads cannot
answer, and to redis-py's pipeline where the connection fails; script calls sent the
same direct way, with redis-py where they must (NOSCRIPT, arguments it encodes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
from redis.asyncio.connection import Connection
from redis.exceptions import ResponseError

from convoq.memory.redis import RedisConversationMemory
from convoq.messages import ImagePart, Message, MessageRole, TextPart
from convoq.redis import connect
from convoq.redis._pipelined import FALLBACK, AsyncDirect, Unpackable, pack
from convoq.redis._pipelined import script as direct_script
from convoq.summary import SUMMARY_PREFIX, Summary
from convoq.window import Window
from tests.support.redis_proxy import LossyProxy
from tests.support.redis_server import RedisServer

# Run again with the fast paths off by `make test-slowpaths`.
pytestmark = pytest.mark.slowpaths

CID = "plain reads"


def turn(n: int) -> list[Message]:
    return [Message.user(f"q{n}"), Message.assistant(f"a{n}")]


def calls(client: redis.Redis, command: str) -> int:
    """Calls of ``command`` Redis ran (a first EVALSHA refused with NOSCRIPT not counted)."""
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0)) - int(stats.get("failed_calls", 0))


@pytest.fixture
async def memory(redis_url: str, key_prefix: str) -> AsyncIterator[RedisConversationMemory]:
    """A memory on a client of the test's own loop (its reads are the test's awaits)."""
    client = connect(redis_url)
    yield RedisConversationMemory(client=client, prefix=key_prefix)
    await client.aclose()


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[LossyProxy]:
    lossy = LossyProxy(redis_server.port)
    yield lossy
    lossy.close()


async def test_a_text_window_is_read_in_one_transaction_without_a_script(
    memory: RedisConversationMemory, redis_client: redis.Redis
) -> None:
    await memory.aappend(CID, [Message.system("be brief"), *turn(0)])
    for n in range(1, 6):
        await memory.aappend(CID, turn(n))
    scripts, transactions = calls(redis_client, "evalsha"), calls(redis_client, "exec")
    window = await memory.aload(CID, last_turns=3)
    assert window == [Message.system("be brief"), *turn(3), *turn(4), *turn(5)]
    assert await memory.aload(CID, last_turns=10) == [
        Message.system("be brief"),
        *(m for n in range(6) for m in turn(n)),
    ]
    assert calls(redis_client, "evalsha") == scripts
    assert calls(redis_client, "exec") == transactions + 2


async def test_windows_plain_reads_cannot_answer_are_read_by_the_script(
    memory: RedisConversationMemory, redis_client: redis.Redis
) -> None:
    picture = Message(
        role=MessageRole.USER,
        content=[TextPart(text="look"), ImagePart(data=b"\x89PNG\x00", mime_type="image/png")],
    )
    await memory.aappend(CID, [picture, Message.assistant("a picture")])
    await memory.aappend(CID, turn(1))
    # A turn stored in two elements: its tool result appended on its own.
    await memory.aappend(CID, turn(2))
    await memory.aappend(CID, [Message.assistant("and more")])
    scripts = calls(redis_client, "evalsha")
    assert await memory.aload(CID, last_turns=1) == [*turn(2), Message.assistant("and more")]
    window = await memory.aload(CID, last_turns=3)
    assert window[0] == picture and window[0].attachments[0].data == b"\x89PNG\x00"
    assert window[2:] == [*turn(1), *turn(2), Message.assistant("and more")]
    assert calls(redis_client, "evalsha") == scripts + 2


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_a_plain_read_whose_connection_drops_is_sent_again(
    proxy: LossyProxy, key_prefix: str, flavour: str
) -> None:
    memory = RedisConversationMemory(proxy.url, prefix=key_prefix)
    try:
        for n in range(3):
            await memory.aappend(CID, turn(n))
        proxy.drop_reply_to(b"LRANGE")
        if flavour == "async":
            window = await memory.aload(CID, last_turns=2)
        else:
            window = await asyncio.to_thread(memory.load, CID, last_turns=2)
        assert proxy.dropped == 1
        assert window == [*turn(1), *turn(2)]
    finally:
        await memory.aclose()


async def test_a_read_cancelled_midway_leaves_no_reply_for_the_next_one(
    proxy: LossyProxy, key_prefix: str
) -> None:
    client = connect(proxy.url)
    memory = RedisConversationMemory(client=client, prefix=key_prefix)
    try:
        await memory.aappend(CID, turn(0))
        await memory.aload(CID, last_turns=1)  # the reader keeps a connection now
        proxy.hold_replies()
        pending = asyncio.ensure_future(memory.aload(CID, last_turns=1))
        await asyncio.sleep(0.2)
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        proxy.release_replies()
        await memory.aappend(CID, turn(1))
        # Had the cancelled read's connection been kept, its late reply (turn 0 alone)
        # would answer this read.
        assert await memory.aload(CID, last_turns=1) == turn(1)
        assert await memory.aload(CID, last_turns=2) == [*turn(0), *turn(1)]
    finally:
        await client.aclose()


def test_pack_writes_what_redis_py_writes() -> None:
    commands = [
        ("MULTI",),
        ("HGET", "p:{c}:meta", "format_version"),
        ("LRANGE", b"p:{\xc3\xa9}:turns", -10, -1),
        ("LRANGE", "p:{é}:lead", 0, -1),
        ("EXEC",),
    ]
    connection = Connection()
    assert pack(commands) == b"".join(connection.pack_commands(commands))
    with pytest.raises(Unpackable):  # not a TypeError: that would be a bug, and raised
        pack([("LRANGE", "k", 0.5, -1)])


async def test_what_a_turn_sends_is_read_plainly_until_a_summary_is_stored(
    memory: RedisConversationMemory, redis_client: redis.Redis
) -> None:
    sent = Window(keep_last_turns=2, with_summary=True)
    for n in range(4):
        await memory.aappend(CID, turn(n))
    scripts = calls(redis_client, "evalsha")
    assert await memory.aload_window(CID, sent) == [*turn(2), *turn(3)]
    assert calls(redis_client, "evalsha") == scripts
    _, _, basis = await memory.asummary_state(CID)
    await memory.acommit_summary(CID, Summary.of("q0 a0 q1 a1", watermark=2, version=1), basis)
    scripts = calls(redis_client, "evalsha")
    window = await memory.aload_window(CID, sent)
    assert window == [Message.system(SUMMARY_PREFIX + "q0 a0 q1 a1"), *turn(2), *turn(3)]
    assert calls(redis_client, "evalsha") == scripts + 1


async def test_a_small_pool_keeps_no_idle_connection_for_plain_reads(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    client = connect(redis_url, max_connections=2)
    memory = RedisConversationMemory(client=client, prefix=key_prefix)
    first_key, second_key = f"{key_prefix}:wait:1", f"{key_prefix}:wait:2"
    try:
        await memory.aappend(CID, turn(0))
        assert await memory.aload(CID, last_turns=1) == turn(0)
        # Both connections of the pool are free again: two reads can block at once.
        first = asyncio.ensure_future(client.blpop([first_key], timeout=0))
        second = asyncio.ensure_future(client.blpop([second_key], timeout=0))
        await asyncio.sleep(0.2)
        redis_client.rpush(second_key, "x")
        assert await asyncio.wait_for(second, timeout=5) == (second_key.encode(), b"x")
        redis_client.rpush(first_key, "y")
        assert await asyncio.wait_for(first, timeout=5) == (first_key.encode(), b"y")
    finally:
        await client.aclose()


async def test_script_calls_go_direct_and_fall_back_to_redis_py_where_they_must(
    redis_url: str, redis_client: redis.Redis
) -> None:
    client = connect(redis_url)
    direct = AsyncDirect(client)
    echo = redis_client.script_load("return {ARGV[1], #KEYS}")
    broken = redis_client.script_load("return redis.call('NOSUCHCOMMAND')")
    try:
        assert await direct.script(echo, ["k1", "k2"], ["é"]) == ["é".encode(), 2]
        assert await direct.script("0" * 40, [], []) is FALLBACK  # NOSCRIPT: redis-py loads it
        assert await direct.script(echo, [], [0.5]) is FALLBACK  # redis-py encodes floats
        with pytest.raises(ResponseError, match="Unknown Redis command"):
            await direct.script(broken, [], [])
        # The connection that carried the error reply serves the next call as usual.
        assert await direct.script(echo, [], [b"again"]) == [b"again", 0]
    finally:
        await client.aclose()


def test_sync_script_calls_go_direct_and_fall_back_the_same_way(redis_client: redis.Redis) -> None:
    echo = redis_client.script_load("return {ARGV[1], #KEYS}")
    broken = redis_client.script_load("return redis.call('NOSUCHCOMMAND')")
    assert direct_script(redis_client, echo, ["k"], [b"x"]) == [b"x", 1]
    assert direct_script(redis_client, "0" * 40, [], []) is FALLBACK
    assert direct_script(redis_client, echo, [], [0.5]) is FALLBACK
    with pytest.raises(ResponseError, match="Unknown Redis command"):
        direct_script(redis_client, broken, [], [])
    assert direct_script(redis_client, echo, [], ["again"]) == [b"again", 0]

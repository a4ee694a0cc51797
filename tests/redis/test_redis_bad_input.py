"""Bad input gets a clear error and changes nothing in Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio as aioredis

from convoq.errors import (
    AttachmentError,
    ConfigurationError,
    ConvoqError,
    CorruptDataError,
    InvalidConversationIdError,
    InvalidMessageError,
    ProtocolError,
    UnsupportedFormatVersionError,
)
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import FilePart, Message, TextPart
from convoq.redis import KeySchema, TurnProtocol
from convoq.redis.protocol import TurnEnding
from tests.support.protocol_helpers import exchange, open_protocol, submit_all

CID = "bad-input"
LEASE = 30_000


@pytest.fixture
async def proto(redis_url: str, key_prefix: str) -> AsyncIterator[TurnProtocol]:
    limits = {"max_attachment_bytes": 1000, "max_turn_bytes": 5000}
    async with open_protocol(redis_url, key_prefix, **limits) as protocol:
        yield protocol


@pytest.fixture
async def memory(redis_url: str, key_prefix: str) -> AsyncIterator[RedisConversationMemory]:
    mem = RedisConversationMemory(
        redis_url, prefix=key_prefix, max_attachment_bytes=1000, max_turn_bytes=5000
    )
    yield mem
    await mem.aclose()


def snapshot(client: redis.Redis, prefix: str) -> dict[bytes, object]:
    """Every key under the prefix with its content, to prove nothing changed."""
    state: dict[bytes, object] = {}
    for key in sorted(client.keys(f"{prefix}*")):
        kind = client.type(key)
        if kind == b"list":
            state[key] = client.lrange(key, 0, -1)
        elif kind == b"hash":
            state[key] = client.hgetall(key)
        elif kind == b"string":
            state[key] = client.get(key)
        else:
            state[key] = client.xrange(key) if kind == b"stream" else kind
    return state


def with_file(size: int) -> Message:
    return Message(content=[TextPart(text="see"), FilePart(data=b"%" * size, mime_type="x/y")])


@pytest.mark.parametrize("cid", ["", "tab\tid", "\x7f", "a" * 257, "new\nline", 42])
async def test_invalid_conversation_ids_touch_nothing(
    proto: TurnProtocol, memory: RedisConversationMemory, redis_client: redis.Redis, cid: object
) -> None:
    calls = [
        proto.submit(cid, "t1", agent="a", message=Message.user("x"), options={}),  # type: ignore[arg-type]
        proto.acquire(cid, worker_id="w", lease_ms=LEASE),  # type: ignore[arg-type]
        proto.history(cid),  # type: ignore[arg-type]
        proto.clear(cid, force=True),  # type: ignore[arg-type]
        proto.cancel(cid, "t1"),  # type: ignore[arg-type]
        memory.aappend(cid, [Message.user("x")]),  # type: ignore[arg-type]
        memory.aload(cid),  # type: ignore[arg-type]
        memory.aclear(cid),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(InvalidConversationIdError):
            await call
    assert redis_client.keys(f"{proto.keys.prefix}*") == []


async def test_invalid_turn_id_and_message_touch_nothing(
    proto: TurnProtocol, redis_client: redis.Redis
) -> None:
    with pytest.raises(InvalidConversationIdError):
        await proto.submit(CID, "bad id", agent="a", message=Message.user("x"), options={})
    with pytest.raises(InvalidMessageError):
        await proto.submit(CID, "t1", agent="a", message=Message.assistant("x"), options={})
    with pytest.raises(ConvoqError, match="JSON-safe"):
        await proto.submit(
            CID, "t1", agent="a", message=Message.user("x"), options={"when": object()}
        )
    assert redis_client.keys(f"{proto.keys.prefix}*") == []


async def test_oversize_attachment_and_turn_are_refused_before_any_write(
    proto: TurnProtocol, memory: RedisConversationMemory, redis_client: redis.Redis
) -> None:
    await proto.submit(CID, "t1", agent="a", message=Message.user("ok"), options={})
    acquired = await proto.acquire(CID, worker_id="w", lease_ms=LEASE)
    assert acquired is not None
    before = snapshot(redis_client, proto.keys.prefix)
    with pytest.raises(AttachmentError, match="max_attachment_bytes=1000"):
        await proto.submit(CID, "t2", agent="a", message=with_file(1001), options={})
    with pytest.raises(AttachmentError):
        await memory.aappend(CID, [with_file(1001)])
    many = [Message.user("x" * 900), *[Message.assistant("y" * 900) for _ in range(6)]]
    with pytest.raises(InvalidMessageError, match="max_turn_bytes=5000"):
        await memory.aappend(CID, many)
    with pytest.raises(InvalidMessageError, match="max_turn_bytes"):
        await proto.commit(CID, "t1", many, TurnEnding(fence=acquired.fence, lease_ms=LEASE))
    with pytest.raises(AttachmentError):
        await proto.commit(
            CID,
            "t1",
            [acquired.turn.input, with_file(2000)],
            TurnEnding(fence=acquired.fence, lease_ms=LEASE),
        )
    assert snapshot(redis_client, proto.keys.prefix) == before


async def test_malformed_stored_turn_names_its_key(
    proto: TurnProtocol, memory: RedisConversationMemory, redis_client: redis.Redis
) -> None:
    await memory.aappend(CID, [Message.user("fine"), Message.assistant("yes")])
    turns = proto.keys.turns(CID)
    redis_client.rpush(turns, b"{not json")
    await proto.submit(CID, "t1", agent="a", message=Message.user("next"), options={})
    before = snapshot(redis_client, proto.keys.prefix)
    with pytest.raises(CorruptDataError, match=turns.replace("{", r"\{").replace("}", r"\}")):
        await memory.aload(CID)
    with pytest.raises(CorruptDataError) as caught:
        await proto.acquire(CID, worker_id="w", lease_ms=LEASE, window=3)
    assert caught.value.details["key"] == turns
    assert snapshot(redis_client, proto.keys.prefix) == before  # no lease, no attempt


@pytest.mark.parametrize(
    "body",
    [
        # A message wrapped in something that is no array: stripping the first and last
        # byte of each body, as the one-call decode of many bodies does, would make a
        # message of it.
        b'x{"role":"user","content":[{"type":"text","text":"forged"}]}y',
        b'{{"role":"user","content":[{"type":"text","text":"forged"}]}}',
        b"[",
        b"",
    ],
)
async def test_a_stored_body_that_is_no_json_array_is_refused_by_every_read(
    proto: TurnProtocol,
    memory: RedisConversationMemory,
    redis_client: redis.Redis,
    body: bytes,
) -> None:
    await memory.aappend(CID, [Message.user("fine"), Message.assistant("yes")])
    turns = proto.keys.turns(CID)
    redis_client.rpush(turns, b"T w=9\n" + body)
    reads = [
        lambda: memory.aload(CID),  # the whole history, read in chunks
        lambda: memory.aload(CID, last_turns=2),  # a window by plain reads
        lambda: proto.history(CID, last_turns=300),  # longer than plain reads take
    ]
    for read in reads:
        with pytest.raises(CorruptDataError) as caught:
            await read()
        assert caught.value.details["key"] == turns
    for keep in (None, 2):
        with pytest.raises(CorruptDataError):
            await asyncio.to_thread(memory.load, CID, last_turns=keep)


async def test_a_missing_blob_or_a_broken_record_names_its_key(
    proto: TurnProtocol, memory: RedisConversationMemory, redis_client: redis.Redis
) -> None:
    await memory.aappend(CID, [with_file(10), Message.assistant("seen")])
    redis_client.delete(proto.keys.blobs(CID))
    with pytest.raises(CorruptDataError) as caught:
        await memory.aload(CID)
    assert caught.value.details["key"] == proto.keys.blobs(CID)
    await proto.submit(CID, "t1", agent="a", message=Message.user("x"), options={})
    redis_client.hset(proto.keys.turn(CID, "t1"), "input", "][")
    with pytest.raises(CorruptDataError) as caught:
        await proto.get_turn(CID, "t1")
    assert caught.value.details["key"] == proto.keys.turn(CID, "t1")


async def test_unknown_format_version_fails_fast_and_changes_nothing(
    proto: TurnProtocol, memory: RedisConversationMemory, redis_client: redis.Redis
) -> None:
    redis_client.hset(proto.keys.meta(CID), "format_version", "99")
    before = snapshot(redis_client, proto.keys.prefix)
    calls = [
        memory.aload(CID),
        memory.aappend(CID, [Message.user("x")]),
        proto.submit(CID, "t1", agent="a", message=Message.user("x"), options={}),
        proto.history(CID, last_turns=2),
    ]
    for call in calls:
        with pytest.raises(UnsupportedFormatVersionError, match="format version '99'"):
            await call
    assert snapshot(redis_client, proto.keys.prefix) == before


async def test_client_and_prefix_misconfiguration_is_reported(redis_url: str) -> None:
    decoding = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        with pytest.raises(ConfigurationError, match="decode_responses=False"):
            TurnProtocol(decoding, KeySchema("p"))
    finally:
        await decoding.aclose()
    with pytest.raises(ConfigurationError):
        RedisConversationMemory(redis_url, prefix="bad prefix")


@pytest.mark.parametrize("peeked", [False, True], ids=["acquired", "in-script"])
async def test_a_commit_stays_a_success_when_the_next_turn_cannot_be_loaded(
    proto: TurnProtocol, redis_client: redis.Redis, peeked: bool
) -> None:
    await submit_all(proto, CID, "t1", "t2")
    acquired = await proto.acquire(CID, worker_id="w", lease_ms=LEASE)
    assert acquired is not None
    redis_client.lpush(proto.keys.turns(CID), b"[broken")
    following = await proto.commit(
        CID,
        "t1",
        exchange("t1"),
        TurnEnding(
            fence=acquired.fence,
            lease_ms=LEASE,
            next_turn_id=acquired.next_turn_id if peeked else None,
        ),
    )
    assert following is None
    assert (await proto.get_turn(CID, "t1")).status == "succeeded"
    assert (await proto.get_turn(CID, "t2")).status == "queued"
    redis_client.delete(proto.keys.lease(CID))
    with pytest.raises(CorruptDataError):
        await proto.acquire(CID, worker_id="w", lease_ms=LEASE)


async def test_a_hand_off_names_a_key_of_the_wrong_type_before_writing_to_the_next_turn(
    proto: TurnProtocol, redis_client: redis.Redis
) -> None:
    await submit_all(proto, CID, "t1", "t2")
    acquired = await proto.acquire(CID, worker_id="w", lease_ms=LEASE)
    assert acquired is not None
    events = proto.keys.events(CID, "t2")  # what handing t2 out writes first
    break_key(redis_client, events)
    t2_before = redis_client.hgetall(proto.keys.turn(CID, "t2"))
    following = await proto.commit(
        CID,
        "t1",
        exchange("t1"),
        TurnEnding(fence=acquired.fence, lease_ms=LEASE, next_turn_id=acquired.next_turn_id),
    )
    assert following is None  # logged; the next acquire after the lease expires reports it
    assert (await proto.get_turn(CID, "t1")).status == "succeeded"
    assert redis_client.hgetall(proto.keys.turn(CID, "t2")) == t2_before
    redis_client.delete(proto.keys.lease(CID))
    with pytest.raises(CorruptDataError) as caught:
        await proto.acquire(CID, worker_id="w", lease_ms=LEASE)
    assert caught.value.details["key"] == events
    assert redis_client.hgetall(proto.keys.turn(CID, "t2")) == t2_before


def break_key(client: redis.Redis, key: str) -> None:
    """Give ``key`` the wrong type, as a stray write by some other program would."""
    client.delete(key)
    client.set(key, "not what convoq stored here")


async def test_protocol_scripts_name_a_key_of_the_wrong_type_before_any_write(
    proto: TurnProtocol, redis_client: redis.Redis
) -> None:
    await submit_all(proto, CID, "t1")
    acquired = await proto.acquire(CID, worker_id="w", lease_ms=LEASE)
    assert acquired is not None
    events, meta = proto.keys.events(CID, "t1"), proto.keys.meta(CID)
    break_key(redis_client, events)
    break_key(redis_client, proto.keys.events(CID, "t2"))
    before = snapshot(redis_client, proto.keys.prefix)
    commit = proto.commit(
        CID, "t1", exchange("t1"), TurnEnding(fence=acquired.fence, lease_ms=LEASE)
    )
    error = ProtocolError("x").to_data()
    calls = [
        (commit, events),
        (proto.fail(CID, "t1", error, TurnEnding(fence=acquired.fence, lease_ms=LEASE)), events),
        (proto.cancel(CID, "t1"), events),
        (proto.submit(CID, "t2", agent="a", message=Message.user("x"), options={}), None),
    ]
    for call, key in calls:
        with pytest.raises(CorruptDataError) as caught:
            await call
        assert caught.value.details["key"] == (key or proto.keys.events(CID, "t2"))
    assert snapshot(redis_client, proto.keys.prefix) == before
    redis_client.delete(events)
    redis_client.hset(meta, "turns", "lots")  # HINCRBY would fail after the append
    with pytest.raises(CorruptDataError, match="meta"):
        await proto.commit(
            CID, "t1", exchange("t1"), TurnEnding(fence=acquired.fence, lease_ms=LEASE)
        )
    assert redis_client.llen(proto.keys.turns(CID)) == 0
    assert (await proto.get_turn(CID, "t1")).status == "running"


async def test_memory_append_names_a_key_of_the_wrong_type_before_any_write(
    proto: TurnProtocol, memory: RedisConversationMemory, redis_client: redis.Redis
) -> None:
    await memory.aappend(CID, exchange("first"))
    break_key(redis_client, proto.keys.blobs(CID))
    before = snapshot(redis_client, proto.keys.prefix)
    with pytest.raises(CorruptDataError) as caught:
        await memory.aappend(CID, [with_file(10), Message.assistant("seen")])
    assert caught.value.details["key"] == proto.keys.blobs(CID)
    assert snapshot(redis_client, proto.keys.prefix) == before
    redis_client.delete(proto.keys.blobs(CID))
    redis_client.hset(proto.keys.meta(CID), "bytes", "1.5")
    before = snapshot(redis_client, proto.keys.prefix)
    with pytest.raises(CorruptDataError) as caught:
        await memory.aappend(CID, exchange("second"))
    assert caught.value.details["key"] == proto.keys.meta(CID)
    assert snapshot(redis_client, proto.keys.prefix) == before

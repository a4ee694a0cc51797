"""Decoded turns kept in process (:mod:`convoq.redis._decoded`): a stored turn read again,
by any read (whole, window, sync, async, a worker's hand-out), is not decoded again; its
messages are shared read-only values; the cache is bounded by bytes, dropped for a
conversation on clear, delete, prune, pop and a new summary, and off with
``CONVOQ_DECODED_CACHE_BYTES=0``."""

from __future__ import annotations

import copy
import gc
import pickle
from collections.abc import AsyncIterator
from enum import Enum
from types import ModuleType

import pytest
from pydantic import ValidationError

from convoq.errors import InvalidMessageError
from convoq.limits import Limits
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import ImagePart, Message, TextPart, ToolCall
from convoq.redis import TurnProtocol, _codec, _decoded
from convoq.redis._decoded import DecodedTurns, estimated_size
from convoq.redis.keys import KeySchema
from convoq.summary import Summary

CID = "cached"


def turn(n: int) -> list[Message]:
    call = ToolCall(id=f"c{n}", name="look", arguments={"where": {"deep": [n]}})
    return [
        Message.user(f"question {n}"),
        Message.assistant("", [call]),
        Message.tool_result(call, "seen"),
        Message.assistant(f"answer {n}"),
    ]


@pytest.fixture
async def memory(redis_url: str, key_prefix: str) -> AsyncIterator[RedisConversationMemory]:
    _decoded.reset()
    made = RedisConversationMemory(redis_url, prefix=key_prefix)
    for n in range(4):
        await made.aappend(CID, turn(n))
    yield made
    await made.aclose()
    _decoded.reset()


def held(memory: RedisConversationMemory, key_prefix: str, cid: str = CID) -> int:
    cache = _decoded.process_cache()
    assert cache is not None
    return cache.held(KeySchema(key_prefix).base(cid))


async def test_every_read_of_a_stored_turn_shares_one_decoded_message(
    memory: RedisConversationMemory,
) -> None:
    whole = await memory.aload(CID)
    assert whole == [m for n in range(4) for m in turn(n)]
    again = await memory.aload(CID)
    window = await memory.aload(CID, last_turns=2)
    blocking = memory.load(CID, last_turns=1)
    assert all(a is b for a, b in zip(whole, again, strict=True))
    assert all(a is b for a, b in zip(whole[8:], window, strict=True))
    assert all(a is b for a, b in zip(whole[12:], blocking, strict=True))
    assert whole is not again  # each read gets a list of its own


async def test_shared_messages_refuse_every_change_and_copy_into_mutable_ones(
    memory: RedisConversationMemory,
) -> None:
    loaded = await memory.aload(CID)
    call = loaded[1].tool_calls[0]
    changes = [
        lambda: loaded[0].content.append(TextPart(text="more")),
        lambda: loaded[0].content.clear(),
        lambda: loaded[1].tool_calls.pop(),
        lambda: call.arguments.update(where=None),
        lambda: call.arguments["where"]["deep"].append(1),
    ]
    for change in changes:
        with pytest.raises(InvalidMessageError) as refused:
            change()
        assert refused.value.details["rule"] == "read_only"
    with pytest.raises(ValidationError):
        loaded[0].role = "assistant"  # type: ignore[assignment]
    with pytest.raises(ValidationError):
        call.name = "other"  # type: ignore[misc]
    assert await memory.aload(CID) == [m for n in range(4) for m in turn(n)]
    for mutable in (loaded[1].model_copy(deep=True), copy.deepcopy(loaded[1])):
        mutable.tool_calls[0].arguments["where"]["deep"].append(1)
        mutable.content.append(TextPart(text="mine"))
        assert type(mutable.content) is list
    unpickled = pickle.loads(pickle.dumps(loaded[1]))
    assert unpickled == loaded[1] and type(unpickled.tool_calls) is list
    assert loaded[1].model_dump_json() == turn(0)[1].model_dump_json()


async def test_attachments_are_kept_with_their_bytes(
    memory: RedisConversationMemory, key_prefix: str
) -> None:
    picture = bytes(range(256)) * 8
    image = ImagePart(data=picture, mime_type="image/png", provider_options={"detail": "low"})
    await memory.aappend("pictures", [Message(content=[image]), Message.assistant("a cat")])
    first, second = await memory.aload("pictures"), await memory.aload("pictures")
    assert first[0] is second[0] and first[0].content[0] == image
    with pytest.raises(InvalidMessageError):
        first[0].content[0].provider_options["detail"] = "high"  # type: ignore[union-attr]
    assert held(memory, key_prefix, "pictures") == 1


async def test_clear_delete_prune_pop_and_a_summary_drop_the_conversation(
    memory: RedisConversationMemory, key_prefix: str
) -> None:
    async def read() -> int:
        await memory.aload(CID)
        return held(memory, key_prefix)

    assert await read() == 4
    await memory.aprune(CID, keep_last_turns=2)
    assert held(memory, key_prefix) == 0
    assert await read() == 2
    await memory.apop_message(CID)
    assert held(memory, key_prefix) == 0
    assert await read() == 2
    _, _, basis = await memory.asummary_state(CID)
    await memory.acommit_summary(CID, Summary(text="so far", watermark=1, version=1), basis)
    assert held(memory, key_prefix) == 0
    assert await read() == 2
    await memory.aclear(CID)
    assert held(memory, key_prefix) == 0
    await memory.aappend(CID, turn(9))
    assert await read() == 1
    await memory.adelete(CID)
    assert held(memory, key_prefix) == 0


async def test_a_workers_window_on_a_conversation_it_read_before_decodes_nothing(
    memory: RedisConversationMemory, proto: TurnProtocol
) -> None:
    loaded = await memory.aload(CID)
    cache = _decoded.process_cache()
    assert cache is not None
    misses = cache.misses
    await proto.submit(CID, "t1", agent="a", message=Message.user("next"), options={})
    acquired = await proto.acquire(CID, worker_id="w", lease_ms=30_000, window=3)
    assert acquired is not None
    assert all(a is b for a, b in zip(acquired.history, loaded[4:], strict=True))
    assert cache.misses == misses


async def test_with_the_cache_off_each_read_decodes_messages_of_its_own(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVOQ_DECODED_CACHE_BYTES", "0")
    _decoded.reset()
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        await memory.aappend(CID, turn(0))
        first, second = await memory.aload(CID), await memory.aload(CID)
        assert first == second == turn(0) and first[0] is not second[0]
        first[0].content.append(TextPart(text="mine"))  # its own: mutable as built
        assert _decoded.process_cache() is None
    finally:
        await memory.aclose()
        _decoded.reset()


def test_the_cache_is_bounded_by_its_estimate_of_bytes() -> None:
    messages = (Message.user("x" * 100),)
    size = estimated_size(b"e" * 200, messages)
    cache = DecodedTurns(max_bytes=3 * size)
    for n in range(5):
        cache.store("a", bytes([n]) * 200, messages)
    assert len(cache) == 3 and cache.size <= cache.max_bytes
    # The oldest went first; a lookup makes an entry the newest.
    assert cache.lookup("a", [bytes([n]) * 200 for n in range(5)])[:2] == [None, None]
    cache.lookup("a", [bytes([2]) * 200])
    cache.store("a", b"\x09" * 200, messages)
    assert cache.lookup("a", [bytes([2]) * 200, bytes([3]) * 200]) == [messages, None]
    cache.store("b", b"z" * (3 * size), messages)  # larger than the bound: not kept
    assert cache.held("b") == 0 and cache.size <= cache.max_bytes


async def test_a_read_past_one_decoding_chunk_keeps_order_and_shares_field_sets(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # More elements than the decoder validates per call, cache off: the messages come in
    # order, each with lists of its own, and with one field set per distinct set of given
    # fields (two tracked objects less each), which a changed copy does not touch.
    monkeypatch.setenv("CONVOQ_DECODED_CACHE_BYTES", "0")
    _decoded.reset()
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    turns = 3 * _codec._CHUNK + 5
    try:
        await memory.aappend(CID, [m for n in range(turns) for m in turn(n)])
        loaded = await memory.aload(CID)
        assert loaded == [m for n in range(turns) for m in turn(n)]
        first, later = loaded[0], loaded[-4]  # two user messages, in different chunks
        assert first.model_fields_set is later.model_fields_set
        assert first.content[0].model_fields_set is later.content[0].model_fields_set
        assert first.content is not later.content and first.tool_calls is not later.tool_calls
        changed = first.model_copy(update={"finish_reason": "stop"})
        assert "finish_reason" in changed.model_fields_set
        assert "finish_reason" not in later.model_fields_set
    finally:
        await memory.aclose()
        _decoded.reset()


def test_a_decoded_message_of_one_text_part_holds_five_tracked_objects() -> None:
    # The message, its __dict__, its content and tool_calls lists, its text part: the
    # field sets are shared, with the cache or without one (seven before).
    enc = _codec.Encoded()
    limits = Limits()
    elements = [
        _codec.encode_element([Message.user(f"q {n}"), Message.assistant(f"a {n}")], limits, enc)
        for n in range(2 * _codec._CHUNK + 1)
    ]
    for cache in (None, DecodedTurns(max_bytes=10**8)):
        loaded = _codec.plain_messages([], elements, starts_only=False, cache=cache, owner="o")
        assert loaded is not None and len(loaded) == 2 * len(elements)
        seen: set[int] = set()
        for message in loaded:
            _tracked(message, seen)
        # Beside those, two field sets in all (the messages', the parts'); kept, the
        # messages share one empty tool_calls list too.
        own = 5 if cache is None else 4
        assert len(seen) == own * len(loaded) + 2 + (cache is not None)


def _tracked(value: object, seen: set[int]) -> None:
    """Every tracked object reachable from ``value`` but classes and modules, into seen."""
    if id(value) in seen or not gc.is_tracked(value) or isinstance(value, type | ModuleType):
        return
    if isinstance(value, Enum):
        return  # module-level constants, not made by a decode
    seen.add(id(value))
    for referent in gc.get_referents(value):
        _tracked(referent, seen)

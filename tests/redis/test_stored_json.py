"""Reads that only forward a history (``aload_json``/``load_json``, ``export_json``): the
JSON they give is exactly the JSON of what a typed load gives, on every backend, for the
lead, windows, attachments and elements stored before headers counted messages; on Redis
no message without attachments is decoded on the way."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator

import pytest
import redis

from convoq._sync import drive
from convoq.errors import ConvoqError
from convoq.memory import ConversationMemory
from convoq.memory.base import StoredConversationMemory
from convoq.memory.redis import RedisConversationMemory
from convoq.memory.transfer import aexport_conversation, aexport_json, import_conversation
from convoq.messages import (
    LEGACY_RECORD_MIME_TYPE,
    ImagePart,
    Message,
    MessageList,
    TextPart,
    ToolCall,
    messages_to_json,
)
from convoq.redis import _decoded
from convoq.redis._raw import StoredJson, json_steps
from convoq.redis._sync_client import BlockingScripts
from convoq.redis.keys import KeySchema
from convoq.summary import Summary

CID = "forwarded"
PICTURE = bytes(range(256)) * 4


def history() -> list[list[Message]]:
    call = ToolCall(id="c1", name="look", arguments={"q": "x"})
    return [
        [Message.system("be brief"), Message.user("one"), Message.assistant("first")],
        [Message(content=[TextPart(text="see"), ImagePart(data=PICTURE, mime_type="image/png")])],
        [Message.user("two"), Message.assistant("", [call]), Message.tool_result(call, "ok")],
        [Message.user("three"), Message.assistant("last")],
    ]


async def test_the_json_of_a_load_whatever_the_backend_and_the_window(
    memory: ConversationMemory,
) -> None:
    assert isinstance(memory, StoredConversationMemory)
    for turn in history():
        await memory.aappend(CID, turn)
    for last_turns in (None, 0, 1, 2, 3, 10):
        typed = await memory.aload(CID, last_turns=last_turns)
        assert await memory.aload_json(CID, last_turns=last_turns) == messages_to_json(typed)
        assert memory.load_json(CID, last_turns=last_turns) == messages_to_json(typed)
    assert await memory.aload_json("never-written") == b"[]"
    with pytest.raises(ConvoqError, match="last_turns must be >= 0"):
        await memory.aload_json(CID, last_turns=-1)


@pytest.fixture
async def redis_memory(redis_url: str, key_prefix: str) -> AsyncIterator[RedisConversationMemory]:
    _decoded.reset()
    made = RedisConversationMemory(redis_url, prefix=key_prefix)
    yield made
    await made.aclose()
    _decoded.reset()


async def test_redis_decodes_only_elements_with_attachments_or_without_a_count(
    redis_memory: RedisConversationMemory, redis_client: redis.Redis, key_prefix: str
) -> None:
    for turn in history():
        await redis_memory.aappend(CID, turn)
    # Stored before headers counted messages (no n=), one with a legacy record part: decoded.
    old = [Message.user("older"), Message.assistant("kept")]
    record = base64.b64encode(b'{"framework":"x","a":1}').decode()
    legacy = {"role": "assistant", "content": [
        {"type": "text", "text": "hi"},
        {"type": "file", "data": record, "mime_type": LEGACY_RECORD_MIME_TYPE},
    ]}  # fmt: skip
    turns = KeySchema(key_prefix).turns(CID)
    redis_client.rpush(turns, b"T w=9\n" + MessageList.dump_json(old))
    redis_client.rpush(turns, b"T w=9\n" + json.dumps([legacy]).encode())
    typed = await redis_memory.aload(CID)
    assert typed[-1].framework == {"x": {"a": 1}}  # the load moved the record
    _decoded.reset()
    raw = await redis_memory.aload_json(CID)
    assert raw == messages_to_json(typed)
    cache = _decoded.process_cache()
    assert cache is not None and cache.misses == 3  # the picture, the old one, the legacy one


async def test_pages_of_the_stored_json_cut_anywhere_are_the_typed_slices(
    redis_memory: RedisConversationMemory, redis_url: str, key_prefix: str
) -> None:
    for turn in history():
        await redis_memory.aappend(CID, turn)
    typed = await redis_memory.aload(CID)
    client = redis.Redis.from_url(redis_url)
    try:
        scripts = BlockingScripts(client)
        stored: StoredJson = drive(json_steps(KeySchema(key_prefix), CID, None), scripts.perform)
    finally:
        client.close()
    assert stored.total == len(typed) == 9
    for offset in range(11):
        for limit in (1, 2, 3, 7, 100):
            page = json.loads(stored.array(offset, limit))
            assert page == json.loads(messages_to_json(typed[offset : offset + limit]))


async def test_an_export_is_the_typed_document_byte_for_byte(
    memory: ConversationMemory, tmp_path: object
) -> None:
    assert isinstance(memory, StoredConversationMemory)
    for turn in history():
        await memory.aappend(CID, turn)
    _, _, basis = await memory.asummary_state(CID)
    await memory.acommit_summary(CID, Summary(text="so far", watermark=1, version=1), basis)
    exported = await aexport_json(memory, CID)
    assert exported == (await aexport_conversation(memory, CID)).to_json().encode()
    await memory.aclear(CID)
    import_conversation(memory, exported, conversation_id=CID)
    assert await memory.aload(CID) == [m for turn in history() for m in turn]
    assert await memory.asummary(CID) == Summary(text="so far", watermark=1, version=1)

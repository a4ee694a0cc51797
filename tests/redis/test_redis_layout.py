"""The stored layout (format 2): element headers Redis reads instead of JSON, the format
version gate, and long histories read in bounded chunks."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest
import redis

from convoq.errors import UnsupportedFormatVersionError
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import ImagePart, Message, MessageRole, TextPart
from convoq.redis import TurnProtocol, scripts
from convoq.redis import _history as history_module

CID = "layout"
LEASE = 30_000


@pytest.fixture
def protocol_url(store_url: str) -> str:
    return store_url


@pytest.fixture
async def memory(store_url: str, key_prefix: str) -> AsyncIterator[RedisConversationMemory]:
    mem = RedisConversationMemory(store_url, prefix=key_prefix)
    yield mem
    await mem.aclose()


def picture(n: int) -> Message:
    image = ImagePart(data=bytes([n % 256]) * 40, mime_type="image/png")
    return Message(role=MessageRole.USER, content=[TextPart(text=f"look {n}"), image])


def history(turns: int) -> list[Message]:
    """``turns`` turns, every tenth with an image."""
    out = [Message.system("be brief")]
    for n in range(turns):
        out += [picture(n) if n % 10 == 0 else Message.user(f"q{n}"), Message.assistant(f"a{n}")]
    return out


async def test_elements_carry_a_header_line_and_meta_says_format_2(
    memory: RedisConversationMemory, proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await memory.aappend(CID, history(2)[1:])
    await memory.aappend(CID, [Message.assistant("more")])
    first, second, third = store_client.lrange(proto.keys.turns(CID), 0, -1)
    sha = store_client.hkeys(proto.keys.blobs(CID))[0]
    assert re.match(rb"T b=" + sha + rb" w=\d+ n=2\n\[", first)
    assert re.match(rb'T w=\d+ n=2\n\[\{"role":"user"', second)
    assert re.match(rb'C w=\d+ n=1\n\[\{"role":"assistant"', third)
    assert store_client.hget(proto.keys.meta(CID), "format_version") == b"2"


def test_the_window_scripts_decode_no_stored_history_inside_redis() -> None:
    # Stored turns are read by their headers, never decoded in Lua. The only JSON the
    # window scripts decode is small: the per-agent windows argument (once per call), a
    # turn record's options when they name a window of their own, and the error a take
    # stores for a turn over a limit (worded by the caller; decoded only then).
    for name in ("load", "acquire", "fail", "window", "prune", "summarise"):
        decoded = re.findall(r"cjson\.decode\)?,? ?\(?([\w.]+)", scripts.source(name))
        assert set(decoded) <= {"o.windows", "options", "worded"}, (name, decoded)


async def test_a_format_1_conversation_is_refused_with_what_to_do(
    memory: RedisConversationMemory, proto: TurnProtocol, store_client: redis.Redis
) -> None:
    store_client.hset(proto.keys.meta(CID), "format_version", "1")
    store_client.rpush(proto.keys.turns(CID), b'{"blobs":[],"messages":[]}')
    for call in (memory.aload(CID), memory.aload(CID, last_turns=2)):
        with pytest.raises(UnsupportedFormatVersionError, match=r"version '1'.*reads version 2"):
            await call
    with pytest.raises(UnsupportedFormatVersionError):
        await memory.aappend(CID, [Message.user("x")])
    assert store_client.llen(proto.keys.turns(CID)) == 1


async def test_long_histories_are_read_in_chunks_with_their_attachments(
    memory: RedisConversationMemory,
    proto: TurnProtocol,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 300 elements: more than one script call reads (INLINE_MAX = 256 in _lib.lua).
    everything = history(300)
    await memory.aappend(CID, everything)
    monkeypatch.setattr(history_module, "CHUNK", 7)
    assert await memory.aload(CID) == everything
    window = await memory.aload(CID, last_turns=280)
    assert window == [everything[0], *everything[-560:]]
    await proto.submit(CID, "t1", agent="a", message=Message.user("next"), options={})
    acquired = await proto.acquire(CID, worker_id="w", lease_ms=LEASE, window=0)
    assert acquired is not None and acquired.history == everything

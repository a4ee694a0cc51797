"""The process's garbage collector is left alone: decoding never switches it off (not even
for a moment, not even when the stored data does not parse), and no code of convoq calls
``gc.disable``. A worker freezes its start-up heap out of the collector's walks."""

from __future__ import annotations

import asyncio
import gc
import json
import re
from pathlib import Path

import pytest
import redis

from convoq.errors import CorruptDataError
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import Message
from convoq.redis import _decoded
from convoq.redis.keys import KeySchema
from tests.support.workers import running_pool

PACKAGE = Path(__file__).resolve().parents[2] / "convoq"


def test_no_code_path_switches_the_collector_off() -> None:
    calls = re.compile(r"\bgc\s*\.\s*(disable|set_threshold)\b")
    found = [
        f"{path.relative_to(PACKAGE)}:{n}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if calls.search(line)
    ]
    assert found == []


async def test_long_reads_decode_with_the_collector_on_and_leave_it_on_when_they_fail(
    redis_url: str, key_prefix: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    switched: list[str] = []
    monkeypatch.setattr(gc, "disable", lambda: switched.append("disable"))
    monkeypatch.setattr(gc, "set_threshold", lambda *a: switched.append("set_threshold"))
    _decoded.reset()
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        turns = [[Message.user(f"q{n}"), Message.assistant("a")] for n in range(1200)]
        await asyncio.gather(*(memory.aappend("long", turn) for turn in turns[:600]))
        await asyncio.gather(*(memory.aappend("long", turn) for turn in turns[600:]))
        assert len(await memory.aload("long")) == 2400
        assert gc.isenabled()
        # A body that is no JSON array, far into a long history: the decode raises.
        redis_client.lset(KeySchema(key_prefix).turns("long"), 1100, b"T\n{not json")
        _decoded.reset()
        with pytest.raises(CorruptDataError):
            await memory.aload("long")
        assert gc.isenabled()
        assert switched == []
    finally:
        await memory.aclose()
        _decoded.reset()


@pytest.mark.slow
def test_a_worker_freezes_its_start_up_heap(
    redis_url: str, tmp_path: Path, redis_client: redis.Redis
) -> None:
    with running_pool(redis_url, tmp_path, 1) as pool:
        entry = redis_client.hget(KeySchema(pool.prefix).workers(), pool.workers[0].name)
    assert entry is not None
    # Celery, kombu and convoq's modules: far more than a bare interpreter's few thousand.
    assert json.loads(entry)["frozen_objects"] > 50_000

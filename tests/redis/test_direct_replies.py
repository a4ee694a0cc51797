"""The direct sender reads its replies straight from hiredis's parser when redis-py uses
it, and through ``read_response`` otherwise: both give the same replies, error replies in
their place, replies larger than one socket read whole, sync and async."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis._parsers import _AsyncRESP2Parser, _RESP2Parser
from redis.exceptions import ResponseError

from convoq.redis import _pipelined

pytestmark = pytest.mark.fast_paths

BIG = bytes(range(256)) * 2048  # 512 KiB: many socket reads


def commands(key: str) -> list[tuple[Any, ...]]:
    return [
        ("GET", f"{key}:big"),
        ("LRANGE", f"{key}:big", 0, -1),  # WRONGTYPE: an error reply in its place
        ("LRANGE", f"{key}:list", 0, -1),
        ("HGET", f"{key}:missing", "field"),
    ]


def seed(url: str, key: str) -> None:
    client = redis.Redis.from_url(url)
    client.set(f"{key}:big", BIG)
    client.rpush(f"{key}:list", b"a", b"b" * 70_000, b"c")
    client.close()


def check(replies: list[Any] | None) -> None:
    assert replies is not None
    assert replies[0] == BIG
    assert isinstance(replies[1], ResponseError) and "WRONGTYPE" in str(replies[1])
    assert replies[2] == [b"a", b"b" * 70_000, b"c"]
    assert replies[3] is None


@pytest.mark.parametrize("parser", [None, _AsyncRESP2Parser], ids=["hiredis", "python"])
@pytest.mark.parametrize("transaction", [False, True])
async def test_async_direct_reads_give_every_reply_whatever_the_parser(
    redis_url: str, key_prefix: str, parser: Any, transaction: bool
) -> None:
    seed(redis_url, key_prefix)
    options = {} if parser is None else {"parser_class": parser}
    client = aioredis.Redis.from_url(redis_url, **options)
    try:
        direct = _pipelined.AsyncDirect(client)
        for _ in range(3):  # the kept connection serves the next call in step
            check(await direct.read(commands(key_prefix), transaction))
    finally:
        await client.aclose()


@pytest.mark.parametrize("parser", [None, _RESP2Parser], ids=["hiredis", "python"])
@pytest.mark.parametrize("transaction", [False, True])
def test_sync_direct_reads_give_every_reply_whatever_the_parser(
    redis_url: str, key_prefix: str, parser: Any, transaction: bool
) -> None:
    seed(redis_url, key_prefix)
    options = {} if parser is None else {"parser_class": parser}
    client = redis.Redis.from_url(redis_url, **options)
    try:
        for _ in range(3):
            check(_pipelined.read(client, commands(key_prefix), transaction))
    finally:
        client.close()


def test_hiredis_parsers_are_the_ones_read_directly() -> None:
    # The names this module leans on exist in the installed redis-py (else it falls back).
    assert _pipelined._ASYNC_HIREDIS is not None and _pipelined._SYNC_HIREDIS is not None
    assert _pipelined._NOT_ENOUGH_DATA is not None

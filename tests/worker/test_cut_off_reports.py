"""A worker's report of a run it lost while it lived (``report_cut_off``), against a real
Redis behind a loopback proxy: sent again while Redis is away until it lands, for a
bounded time only, and not at all once the worker shuts down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from convoq._ports import free_loopback_port
from convoq.redis import Acquired, TurnProtocol
from convoq.worker._cut_offs import REPORT_FOR_S, report_cut_off
from convoq.worker._lease import Closing
from tests.support.protocol_helpers import open_protocol, submit_all
from tests.support.redis_proxy import LossyProxy
from tests.support.redis_server import RedisServer

CID = "reported"
LEASE_MS = 30_000


@pytest.fixture
async def proxy(redis_server: RedisServer) -> AsyncIterator[LossyProxy]:
    link = LossyProxy(redis_server.port)
    yield link
    link.close()


async def lost_run(proto: TurnProtocol) -> Acquired:
    """A run of the conversation's turn whose lease then lapsed."""
    await submit_all(proto, CID, "t1")
    acquired = await proto.acquire(CID, worker_id="w1", lease_ms=LEASE_MS)
    assert acquired is not None
    await proto.redis.delete(proto.keys.lease(CID))
    return acquired


async def test_a_report_is_sent_again_until_redis_answers(
    proto: TurnProtocol, proxy: LossyProxy, key_prefix: str
) -> None:
    acquired = await lost_run(proto)
    async with open_protocol(proxy.url, key_prefix) as behind:
        proxy.cut(drop=True)
        report = asyncio.ensure_future(
            report_cut_off(behind, acquired, closing=Closing(), try_for_s=0.5)
        )
        await asyncio.sleep(1.0)
        assert not report.done()  # still trying while the link is down
        proxy.restore()
        assert await asyncio.wait_for(report, 30) is True
    record = await proto.redis.hmget(proto.keys.turn(CID, "t1"), ["runs", "cut_offs"])
    assert record == [b"0", b"1"]


async def test_a_report_gives_up_after_its_bound(proto: TurnProtocol, key_prefix: str) -> None:
    acquired = await lost_run(proto)
    nowhere = f"redis://127.0.0.1:{free_loopback_port()}/0"
    async with open_protocol(nowhere, key_prefix) as unreachable:
        counted = await report_cut_off(
            unreachable, acquired, closing=Closing(), try_for_s=0.5, report_for_s=1.0
        )
    assert counted is False  # the run counts as crashed
    assert await proto.redis.hget(proto.keys.turn(CID, "t1"), "cut_offs") is None
    assert REPORT_FOR_S == 120.0  # what the guarantees page says ("up to 2 minutes")


async def test_no_report_once_the_worker_shuts_down(proto: TurnProtocol) -> None:
    acquired = await lost_run(proto)
    closing = Closing()
    closing.set()
    assert await report_cut_off(proto, acquired, closing=closing, try_for_s=0.5) is False
    assert await proto.redis.hget(proto.keys.turn(CID, "t1"), "cut_offs") is None

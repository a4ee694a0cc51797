"""kill -9 of redis-server between the steps of a conversation: with AOF everything the
protocol acknowledged is still there, and scripts reload on their own (NOSCRIPT)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from convoq.messages import ImagePart, Message, TextPart, ToolCall
from convoq.redis import TurnProtocol
from convoq.redis.protocol import TurnEnding
from convoq.turn_state import TurnState
from tests.support.protocol_helpers import exchange, open_protocol
from tests.support.redis_server import RedisServer

CID = "restart"
LEASE = 60_000


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    own = RedisServer(tmp_path / "redis")
    own.start()
    yield own
    own.stop()


@pytest.fixture
async def proto(server: RedisServer, key_prefix: str) -> AsyncIterator[TurnProtocol]:
    async with open_protocol(server.url, key_prefix) as protocol:
        yield protocol


def crash(server: RedisServer) -> None:
    server.kill()
    server.start()


async def test_a_conversation_survives_kill_9_between_every_step(
    server: RedisServer, proto: TurnProtocol
) -> None:
    picture = bytes(range(256)) * 16
    first = Message(content=[TextPart(text="look"), ImagePart(data=picture, mime_type="x/y")])
    await proto.submit(CID, "t1", agent="bot", message=first, options={"keep_last_turns": 3})
    await proto.submit(CID, "t2", agent="bot", message=Message.user("then"), options={})
    crash(server)  # after submit
    assert (await proto.get_turn(CID, "t1")).input == first
    acquired = await proto.acquire(CID, worker_id="w1", lease_ms=LEASE)
    assert acquired is not None
    crash(server)  # after acquire: the lease and its fence are still held
    assert await proto.acquire(CID, worker_id="w2", lease_ms=LEASE) is None
    await proto.renew(CID, fence=acquired.fence, lease_ms=LEASE)
    calls = [ToolCall(id="c1", name="wire_money", arguments={"amount": 10})]
    state = TurnState(messages=[first, Message.assistant("", calls)], steps=1, pending=calls)
    await proto.park(CID, "t1", fence=acquired.fence, state=state, approval_ttl_ms=LEASE)
    crash(server)  # after park
    assert (await proto.get_turn(CID, "t1")).status == "awaiting_approval"
    assert await proto.acquire(CID, worker_id="w2", lease_ms=LEASE) is None
    assert await proto.decide(CID, "t1", call_id="c1", approved=True) == "resume"
    crash(server)  # after decide: the continuation and the decision
    resumed = await proto.acquire(CID, worker_id="w2", lease_ms=LEASE)
    assert resumed is not None
    assert resumed.state is not None
    assert resumed.state.messages == state.messages
    assert resumed.state.decisions["c1"].approved
    turn = [*state.messages, Message.tool_result(calls[0], "sent"), Message.assistant("done")]
    following = await proto.commit(CID, "t1", turn, TurnEnding(fence=resumed.fence, lease_ms=LEASE))
    assert following is not None
    crash(server)  # after commit: history, blob and the handed-off lease
    assert await proto.history(CID) == turn
    assert (await proto.get_turn(CID, "t1")).status == "succeeded"
    assert await proto.acquire(CID, worker_id="w3", lease_ms=LEASE) is None
    await proto.commit(
        CID, "t2", exchange("then"), TurnEnding(fence=following.fence, lease_ms=LEASE)
    )
    crash(server)
    history = await proto.history(CID, last_turns=2)
    assert [m.text for m in history] == [m.text for m in turn] + ["then", "ok"]
    assert history[0].attachments[0].data == picture


async def test_a_fresh_client_after_a_restart_sees_the_same_state(
    server: RedisServer, key_prefix: str
) -> None:
    async with open_protocol(server.url, key_prefix) as before:
        await before.submit(CID, "t1", agent="bot", message=Message.user("hi"), options={})
        acquired = await before.acquire(CID, worker_id="w1", lease_ms=LEASE)
        assert acquired is not None
    crash(server)
    async with open_protocol(server.url, key_prefix) as after:
        assert await after.acquire(CID, worker_id="w2", lease_ms=LEASE) is None
        turn = exchange("hi", "yo")
        await after.commit(CID, "t1", turn, TurnEnding(fence=acquired.fence, lease_ms=LEASE))
        assert [m.text for m in await after.history(CID)] == ["hi", "yo"]


async def test_scripts_reload_after_script_flush(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    async with open_protocol(redis_url, key_prefix) as proto:
        await proto.submit(CID, "t1", agent="bot", message=Message.user("a"), options={})
        redis_client.script_flush()
        await proto.submit(CID, "t2", agent="bot", message=Message.user("b"), options={})
        assert redis_client.lrange(proto.keys.inbox(CID), 0, -1) == [b"t1", b"t2"]

"""Every write script is safe to resend: a reply lost after Redis ran the script makes
redis-py resend it, and the resend must change nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from convoq import Agent
from convoq.errors import TurnAlreadyAppliedError
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import Message
from convoq.models import ModelRequest, ScriptedModel
from convoq.redis import TurnEnding
from convoq.turn_state import TurnEvent, TurnState
from tests.support.protocol_helpers import exchange, open_protocol, submit_all
from tests.support.redis_proxy import LossyProxy
from tests.support.redis_server import RedisServer

# Run again with the fast paths off by `make test-slowpaths`.
pytestmark = pytest.mark.slowpaths


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[LossyProxy]:
    lossy = LossyProxy(redis_server.port)
    yield lossy
    lossy.close()


def _turn(text: str) -> list[Message]:
    return [Message.user(text), Message.assistant("answer")]


def test_an_append_whose_reply_is_lost_is_stored_once(proxy: LossyProxy, key_prefix: str) -> None:
    memory = RedisConversationMemory(proxy.url, prefix=key_prefix)
    try:
        memory.append("c", _turn("first"))  # scripts loaded, connection open
        proxy.drop_reply_to(b"EVALSHA")
        memory.append("c", _turn("one turn"))
        assert proxy.dropped == 1  # the resend really happened
        texts = [m.text for m in memory.load("c")]
        assert texts == ["first", "answer", "one turn", "answer"]
    finally:
        memory.close()


async def test_a_checkpoint_whose_reply_is_lost_adds_its_events_once(
    proxy: LossyProxy, key_prefix: str
) -> None:

    async with open_protocol(proxy.url, key_prefix) as proto:
        await submit_all(proto, "c", "t1")
        taken = await proto.acquire("c", worker_id="w", lease_ms=30_000)
        assert taken is not None
        state = TurnState(messages=[taken.turn.input, Message.assistant("half")], steps=1)
        proxy.drop_reply_to(b"EVALSHA")
        delta = TurnEvent(type="text_delta", data={"text": "half"})
        await proto.checkpoint("c", "t1", fence=taken.fence, state=state, events=[delta])
        assert proxy.dropped == 1
        events = await proto.read_events("c", "t1")
        assert [e.type for _, e in events].count("text_delta") == 1


async def test_a_commit_whose_reply_is_lost_stores_the_turn_once(
    proxy: LossyProxy, key_prefix: str
) -> None:
    async with open_protocol(proxy.url, key_prefix) as proto:
        await submit_all(proto, "c", "t1")
        taken = await proto.acquire("c", worker_id="w", lease_ms=30_000)
        assert taken is not None
        proxy.drop_reply_to(b"EVALSHA")
        with pytest.raises(TurnAlreadyAppliedError):  # the resend's answer: done already
            await proto.commit("c", "t1", exchange("t1"), TurnEnding(fence=taken.fence))
        assert proxy.dropped == 1
        assert [m.text for m in await proto.history("c")] == ["t1", "ok"]


async def test_an_async_append_whose_reply_is_lost_is_stored_once(
    proxy: LossyProxy, key_prefix: str
) -> None:
    memory = RedisConversationMemory(proxy.url, prefix=key_prefix)
    try:
        await memory.aappend("c", _turn("first"))
        proxy.drop_reply_to(b"EVALSHA")
        await memory.aappend("c", _turn("one turn"))
        assert proxy.dropped == 1
        texts = [m.text for m in await memory.aload("c")]
        assert texts == ["first", "answer", "one turn", "answer"]
    finally:
        await memory.aclose()


async def test_an_agent_turn_whose_lease_reply_is_lost_still_runs_once(
    proxy: LossyProxy, key_prefix: str
) -> None:
    memory = RedisConversationMemory(proxy.url, prefix=key_prefix)
    agent = Agent(ScriptedModel(lambda _: "answer"), memory=memory, conversation_id="c")
    try:
        assert await memory.aload("c") == []
        proxy.drop_reply_to(b"EVALSHA")  # the turn's first script: taking the lease
        assert (await agent.agenerate("one turn")).text == "answer"
        assert proxy.dropped == 1
        assert [m.text for m in await memory.aload("c")] == ["one turn", "answer"]
    finally:
        await memory.aclose()


async def test_an_agent_turn_whose_commit_reply_is_lost_is_stored_once(
    proxy: LossyProxy, key_prefix: str
) -> None:
    def answer(_: ModelRequest) -> str:
        proxy.drop_reply_to(b"EVALSHA")  # the next script is the fenced commit
        return "answer"

    memory = RedisConversationMemory(proxy.url, prefix=key_prefix)
    agent = Agent(ScriptedModel(answer), memory=memory, conversation_id="c")
    try:
        assert (await agent.agenerate("one turn")).text == "answer"
        assert proxy.dropped == 1
        assert [m.text for m in await memory.aload("c")] == ["one turn", "answer"]
        assert (await agent.agenerate("next")).text == "answer"  # the lease was freed
    finally:
        await memory.aclose()


async def test_a_retry_whose_reply_is_lost_queues_the_turn_once(
    proxy: LossyProxy, key_prefix: str
) -> None:
    async with open_protocol(proxy.url, key_prefix) as proto:
        await submit_all(proto, "c", "t1")
        taken = await proto.acquire("c", worker_id="w", lease_ms=30_000)
        assert taken is not None
        error = {"type": "ModelError", "message": "down", "details": {}}
        await proto.fail("c", "t1", error, TurnEnding(fence=taken.fence))
        proxy.drop_reply_to(b"EVALSHA")
        retried = await proto.retry("c", "t1", token="one-request")
        assert proxy.dropped == 1
        assert (retried.repeated, retried.status, retried.retries) == (True, "queued", 1)
        assert await proto.redis.lrange(proto.keys.inbox("c"), 0, -1) == [b"t1"]
        events = [e.type for _, e in await proto.read_events("c", "t1")]
        assert events.count("retried") == 1


async def test_a_cut_off_report_whose_reply_is_lost_counts_the_run_once(
    proxy: LossyProxy, key_prefix: str
) -> None:
    async with open_protocol(proxy.url, key_prefix) as proto:
        await submit_all(proto, "c", "t1")
        taken = await proto.acquire("c", worker_id="w", lease_ms=30_000)
        assert taken is not None
        proxy.drop_reply_to(b"EVALSHA")
        assert not await proto.report_cut_off("c", "t1", fence=taken.fence)  # the resend: seen
        assert proxy.dropped == 1
        fields = await proto.redis.hmget(proto.keys.turn("c", "t1"), ["runs", "cut_offs"])
        assert fields == [b"0", b"1"]

"""What a turn spares Redis and what it still does: a conversation's window reads the lead
list only when meta does not say it is empty (its ``lead`` field, kept by the first write
of a history and by every lead write; a conversation stored before it existed has none and
is read as before), and a turn's ending deletes a journal or continuation only when the
turn may have one (a checkpoint marked it, or it parked)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis

from convoq.memory.redis import RedisConversationMemory
from convoq.messages import Message, ToolCall
from convoq.redis import TurnProtocol
from convoq.redis.protocol import TurnEnding
from convoq.turn_state import TurnState
from tests.support.protocol_helpers import exchange, open_protocol, submit_all

LEASE = 30_000


@pytest.fixture
async def proto(redis_url: str, key_prefix: str) -> AsyncIterator[TurnProtocol]:
    async with open_protocol(redis_url, key_prefix) as protocol:
        yield protocol


@pytest.fixture
async def memory(redis_url: str, key_prefix: str) -> AsyncIterator[RedisConversationMemory]:
    made = RedisConversationMemory(redis_url, prefix=key_prefix)
    yield made
    await made.aclose()


def lrange_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_lrange", {}).get("calls", 0))


async def window_of(proto: TurnProtocol, cid: str, tid: str) -> list[Message]:
    await submit_all(proto, cid, tid)
    acquired = await proto.acquire(cid, worker_id="w", lease_ms=LEASE, window=5)
    assert acquired is not None
    await proto.commit(cid, tid, exchange(tid), TurnEnding(fence=acquired.fence, lease_ms=LEASE))
    return acquired.history


@pytest.mark.parametrize("lead", [[], [Message.system("be brief")]], ids=["no lead", "lead"])
async def test_meta_says_whether_the_lead_list_is_read(
    proto: TurnProtocol,
    memory: RedisConversationMemory,
    redis_client: redis.Redis,
    lead: list[Message],
) -> None:
    await memory.aappend("c", [*lead, *exchange("one")])
    meta = proto.keys.meta("c")
    assert redis_client.hget(meta, "lead") == (b"1" if lead else b"0")
    before = lrange_calls(redis_client)
    assert await window_of(proto, "c", "t1") == [*lead, *exchange("one")]
    # The inbox twice (acquire, commit) and the window; the lead list too when it has one.
    assert lrange_calls(redis_client) - before == (4 if lead else 3)
    # Stored before the field existed: no field, the list is read (and the window right).
    redis_client.hdel(meta, "lead")
    before = lrange_calls(redis_client)
    assert await window_of(proto, "c", "t2") == [*lead, *exchange("one"), *exchange("t1")]
    assert lrange_calls(redis_client) - before == 4


async def test_a_first_commit_says_there_is_no_lead(
    proto: TurnProtocol, redis_client: redis.Redis
) -> None:
    assert await window_of(proto, "fresh", "t1") == []
    assert redis_client.hget(proto.keys.meta("fresh"), "lead") == b"0"
    assert await window_of(proto, "fresh", "t2") == exchange("t1")


async def test_an_ending_deletes_the_journal_a_checkpoint_wrote(
    proto: TurnProtocol, redis_client: redis.Redis
) -> None:
    await submit_all(proto, "j", "t1")
    acquired = await proto.acquire("j", worker_id="w", lease_ms=LEASE)
    assert acquired is not None
    state = TurnState(messages=[acquired.turn.input, Message.assistant("thinking")], steps=1)
    await proto.checkpoint("j", "t1", fence=acquired.fence, state=state)
    journal = proto.keys.journal("j", "t1")
    assert redis_client.exists(journal)
    await proto.commit("j", "t1", exchange("t1"), TurnEnding(fence=acquired.fence, lease_ms=LEASE))
    assert not redis_client.exists(journal)


async def test_an_ending_deletes_the_continuation_of_a_turn_that_parked(
    proto: TurnProtocol, redis_client: redis.Redis
) -> None:
    await submit_all(proto, "p", "t1")
    acquired = await proto.acquire("p", worker_id="w", lease_ms=LEASE)
    assert acquired is not None
    call = ToolCall(id="a", name="pay", arguments={})
    parked = TurnState(
        messages=[acquired.turn.input, Message.assistant("", tool_calls=[call])],
        steps=1,
        pending=[call],
    )
    await proto.park("p", "t1", fence=acquired.fence, state=parked, approval_ttl_ms=60_000)
    assert await proto.decide("p", "t1", call_id="a", approved=True) == "resume"
    resumed = await proto.acquire("p", worker_id="w", lease_ms=LEASE)
    assert resumed is not None and resumed.state is not None
    cont = proto.keys.cont("p", "t1")
    assert redis_client.exists(cont)
    await proto.commit("p", "t1", exchange("t1"), TurnEnding(fence=resumed.fence, lease_ms=LEASE))
    assert not redis_client.exists(cont)

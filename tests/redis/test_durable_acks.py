"""min_replicas_acked: a submit, commit or park is answered only once that many replicas
have it (Redis WAIT on the primary that ran it), else NotDurableError; resending it is a
replay that waits again. Real redis-servers with real (asynchronous) replication."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from convoq import Agent, Client
from convoq.client import AsyncClient
from convoq.errors import (
    ConfigurationError,
    ConversationMemoryError,
    NotDurableError,
    TurnAlreadyAppliedError,
)
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import Message, ToolCall
from convoq.redis import KeySchema
from convoq.redis.protocol import TurnEnding
from convoq.settings import ConvoqSettings
from convoq.testing import RecordingModel
from convoq.turn_state import TurnState
from tests.support.protocol_helpers import exchange, open_protocol
from tests.support.redis_cluster import RedisClusterNodes
from tests.support.replicas import ReplicatedPair, freeze, thaw, wait_links_up

CID = "durable-conversation"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicatedPair]:
    servers = ReplicatedPair(Path(tmp_path_factory.mktemp("pair")))
    servers.start()
    yield servers
    servers.stop()


def _waits_called(primary: redis.Redis) -> int:
    return int(primary.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


def thaw_after_a_wait_ran_out(pair: ReplicatedPair, before: int) -> None:
    """SIGCONT the frozen replica once the client sent its second WAIT: its first ran out
    unconfirmed (Redis counts a WAIT when it is called, blocking or not)."""
    primary = redis.Redis(host="127.0.0.1", port=pair.primary.port)
    try:
        for _ in range(600):  # bounded: 30 s
            if _waits_called(primary) >= before + 2:
                break
            threading.Event().wait(0.05)
    finally:
        thaw(pair.replica)
        primary.close()


def replica_status(pair: ReplicatedPair, prefix: str, tid: str) -> bytes | None:
    replica = redis.Redis(host="127.0.0.1", port=pair.replica.port)
    try:
        status: bytes | None = replica.hget(KeySchema(prefix).turn(CID, tid), "status")
        return status
    finally:
        replica.close()


async def test_acknowledged_writes_are_on_the_replica(
    pair: ReplicatedPair, key_prefix: str
) -> None:
    async with open_protocol(pair.primary.url, key_prefix, min_replicas_acked=1) as proto:
        await proto.submit(CID, "t1", agent="bot", message=Message.user("t1"), options={})
        # Read on the replica at once: WAIT already saw it there.
        assert replica_status(pair, key_prefix, "t1") == b"queued"
        acq = await proto.acquire(CID, worker_id="w", lease_ms=5000)
        assert acq is not None
        await proto.commit(CID, "t1", exchange("t1"), TurnEnding(fence=acq.fence))
        assert replica_status(pair, key_prefix, "t1") == b"succeeded"


async def test_more_replicas_than_exist_is_not_durable(
    pair: ReplicatedPair, key_prefix: str
) -> None:
    async with open_protocol(
        pair.primary.url, key_prefix, min_replicas_acked=2, replica_ack_timeout_ms=50
    ) as proto:
        with pytest.raises(NotDurableError) as caught:
            await proto.submit(CID, "t1", agent="bot", message=Message.user("t1"), options={})
        assert caught.value.details["replicas"] == 1
        assert caught.value.details["wanted"] == 2


async def test_a_frozen_replica_makes_a_commit_not_durable_and_its_replay_waits_again(
    pair: ReplicatedPair, key_prefix: str
) -> None:
    async with open_protocol(
        pair.primary.url, key_prefix, min_replicas_acked=1, replica_ack_timeout_ms=300
    ) as proto:
        await proto.submit(CID, "t1", agent="bot", message=Message.user("t1"), options={})
        acq = await proto.acquire(CID, worker_id="w", lease_ms=10_000)
        assert acq is not None
        freeze(pair.replica)
        try:
            with pytest.raises(NotDurableError):
                await proto.commit(CID, "t1", exchange("t1"), TurnEnding(fence=acq.fence))
            # Applied on the primary; its replay writes nothing and is still unconfirmed.
            with pytest.raises(NotDurableError):
                await proto.commit(CID, "t1", exchange("t1"), TurnEnding(fence=acq.fence))
        finally:
            thaw(pair.replica)
        # Once the replica answers, the replay is confirmed and says "already applied".
        with pytest.raises(TurnAlreadyAppliedError):
            await proto.commit(CID, "t1", exchange("t1"), TurnEnding(fence=acq.fence))
        assert replica_status(pair, key_prefix, "t1") == b"succeeded"
        assert await proto.history(CID) == exchange("t1")


async def test_a_fail_waits_for_the_replica(pair: ReplicatedPair, key_prefix: str) -> None:
    async with open_protocol(
        pair.primary.url, key_prefix, min_replicas_acked=1, replica_ack_timeout_ms=300
    ) as proto:
        await proto.submit(CID, "t1", agent="bot", message=Message.user("t1"), options={})
        acq = await proto.acquire(CID, worker_id="w", lease_ms=10_000)
        assert acq is not None
        error = {"type": "ToolError", "message": "boom", "details": {}}
        freeze(pair.replica)
        try:
            with pytest.raises(NotDurableError):
                await proto.fail(CID, "t1", error, TurnEnding(fence=acq.fence))
        finally:
            thaw(pair.replica)
        with pytest.raises(TurnAlreadyAppliedError):
            await proto.fail(CID, "t1", error, TurnEnding(fence=acq.fence))
        assert replica_status(pair, key_prefix, "t1") == b"failed"


async def test_a_park_waits_for_the_replica(pair: ReplicatedPair, key_prefix: str) -> None:
    async with open_protocol(
        pair.primary.url, key_prefix, min_replicas_acked=1, replica_ack_timeout_ms=300
    ) as proto:
        await proto.submit(CID, "t1", agent="bot", message=Message.user("t1"), options={})
        acq = await proto.acquire(CID, worker_id="w", lease_ms=10_000)
        assert acq is not None
        calls = [ToolCall(id="c1", name="pay", arguments={"to": "x"})]
        state = TurnState(
            messages=[acq.turn.input, Message.assistant("", tool_calls=calls)],
            steps=1,
            pending=calls,
        )
        freeze(pair.replica)
        try:
            with pytest.raises(NotDurableError):
                await proto.park(CID, "t1", fence=acq.fence, state=state, approval_ttl_ms=60_000)
        finally:
            thaw(pair.replica)
        # The replay (parked already with this fence) is a no-op, confirmed this time.
        await proto.park(CID, "t1", fence=acq.fence, state=state, approval_ttl_ms=60_000)
        assert replica_status(pair, key_prefix, "t1") == b"awaiting_approval"


async def test_a_client_resends_an_unconfirmed_submit_and_queues_it_once(
    pair: ReplicatedPair, key_prefix: str
) -> None:
    client = AsyncClient(
        pair.primary.url,
        prefix=key_prefix,
        agents=["bot"],
        min_replicas_acked=1,
        replica_ack_timeout_ms=2000,
    )
    async with client:
        freeze(pair.replica)
        # The first send times out unconfirmed; only once the second one waits does the
        # replica answer again, with that send's 2 s (and a third's) to confirm it:
        # ordered by what Redis saw, not by a timer.
        primary = redis.Redis(host="127.0.0.1", port=pair.primary.port)
        before = _waits_called(primary)
        thawing = threading.Thread(target=thaw_after_a_wait_ran_out, args=(pair, before))
        thawing.start()
        try:
            handle = await client.submit(CID, "hello", agent="bot")
        finally:
            thawing.join(30)
    try:
        assert _waits_called(primary) >= before + 2  # unconfirmed, then sent again
        inbox = primary.lrange(KeySchema(key_prefix).inbox(CID), 0, -1)
    finally:
        primary.close()
    assert inbox == [handle.turn_id.encode()]
    assert replica_status(pair, key_prefix, handle.turn_id) == b"queued"


async def test_on_a_cluster_each_write_waits_on_its_slots_primary(
    redis_cluster: RedisClusterNodes, key_prefix: str
) -> None:
    wait_links_up(redis_cluster.ports)
    async with open_protocol(redis_cluster.url, key_prefix, min_replicas_acked=1) as proto:
        cids = redis_cluster.conversations_on_every_primary(key_prefix, 1)
        for cid in cids:
            await proto.submit(cid, "t1", agent="bot", message=Message.user("t1"), options={})
            acq = await proto.acquire(cid, worker_id="w", lease_ms=5000)
            assert acq is not None
            await proto.commit(cid, "t1", exchange("t1"), TurnEnding(fence=acq.fence))
            assert await proto.history(cid) == exchange("t1")
    # Each primary has one replica: asking for two can never be confirmed.
    async with open_protocol(
        redis_cluster.url, key_prefix, min_replicas_acked=2, replica_ack_timeout_ms=50
    ) as proto:
        with pytest.raises(NotDurableError):
            await proto.submit(cids[0], "t2", agent="bot", message=Message.user("t2"), options={})


def test_the_setting_resolves_like_every_other(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVOQ_MIN_REPLICAS_ACKED", "1")
    monkeypatch.setenv("CONVOQ_REPLICA_ACK_TIMEOUT_MS", "250")
    settings = ConvoqSettings.resolve()
    assert (settings.min_replicas_acked, settings.replica_ack_timeout_ms) == (1, 250)
    client = Client("redis://127.0.0.1:1/0", min_replicas_acked=2)
    acks = client.async_client.protocol.acks
    assert (acks.replicas, acks.timeout_ms) == (2, 250)
    assert ConvoqSettings.resolve().min_replicas_acked == 1
    monkeypatch.setenv("CONVOQ_MIN_REPLICAS_ACKED", "-1")
    with pytest.raises(ConfigurationError, match="CONVOQ_MIN_REPLICAS_ACKED"):
        ConvoqSettings.resolve()


def test_default_is_off() -> None:
    assert ConvoqSettings().min_replicas_acked == 0
    assert not Client("redis://127.0.0.1:1/0").async_client.protocol.acks.enabled


async def test_an_in_process_agent_on_the_redis_memory_waits_for_replicas(
    pair: ReplicatedPair, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory builds its protocol from every resolved setting, as client and worker
    do: CONVOQ_MIN_REPLICAS_ACKED holds for an in-process Agent's turns too."""
    monkeypatch.setenv("CONVOQ_MIN_REPLICAS_ACKED", "2")  # the pair has one replica
    # Long enough for the one replica to confirm on a loaded machine (the WAIT for two
    # always lasts it out): the error then says 1 of 2, not 0 of 2.
    monkeypatch.setenv("CONVOQ_REPLICA_ACK_TIMEOUT_MS", "1000")
    memory = RedisConversationMemory(pair.primary.url, prefix=key_prefix)
    agent = Agent(RecordingModel(), memory=memory)
    try:
        with pytest.raises(ConversationMemoryError) as caught:
            await agent.agenerate("hi", conversation_id=CID)
        cause = caught.value.__cause__
        assert isinstance(cause, NotDurableError)
        assert (cause.details["replicas"], cause.details["wanted"]) == (1, 2)
    finally:
        await memory.aclose()

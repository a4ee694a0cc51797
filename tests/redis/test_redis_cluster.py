"""Redis Cluster: the ``redis+cluster://`` URL, the broker it cannot be, and what spans the
whole cluster (the sweeper's and clear's SCAN, the registry, the epoch marker) on a real
3-primary cluster."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from convoq import Agent, tool
from convoq.errors import ConfigurationError
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import Message, MessageRole, ToolCall
from convoq.models import ModelRequest, ScriptedModel
from convoq.queue.transport import broker_url_for
from convoq.redis import TurnProtocol, connect
from convoq.redis._sync_client import connect_blocking
from convoq.redis._urls import parse_cluster_url
from convoq.worker.profiles import Profiles
from convoq.worker.runner import Runner, RunnerConfig
from tests.support import services
from tests.support.protocol_helpers import open_protocol
from tests.support.redis_cluster import RedisClusterNodes
from tests.support.tls import make_tls_files


def test_a_cluster_url_names_its_startup_nodes_and_credentials() -> None:
    address = parse_cluster_url("redis+cluster://al%40x:p%3Ass@10.0.0.1:7000,[::1]:7001/0")
    assert address.nodes == (("10.0.0.1", 7000), ("::1", 7001))
    assert (address.username, address.password) == ("al@x", "p:ss")
    assert parse_cluster_url("redis+cluster://h:1").username is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://h:7000/1", "only database 0"),
        ("redis+cluster://h:7000?socket_timeout=1", "takes no options"),
        ("redis+cluster://h:7000,h", "'h', not host:port"),
        ("redis+cluster://:pw@h:99999", "not host:port"),
    ],
)
def test_a_bad_cluster_url_is_refused_with_what_to_write(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says) as caught:
        connect(url)
    assert "pw" not in str(caught.value)  # the password is never shown
    with pytest.raises(ConfigurationError, match=says):
        connect_blocking(url)


def test_a_cluster_cannot_be_the_broker() -> None:
    cluster = "redis+cluster://127.0.0.1:7000"
    with pytest.raises(ConfigurationError, match=r"set\s+CONVOQ_BROKER_URL"):
        broker_url_for(cluster)
    assert broker_url_for(cluster, "amqp://guest@h//") == "amqp://guest@h//"
    assert broker_url_for("redis://h:1/0") == "redis://h:1/0"  # unchanged without a cluster


async def test_connect_gives_a_cluster_client_for_a_cluster_url(
    redis_cluster: RedisClusterNodes,
) -> None:
    client = connect(redis_cluster.url)
    try:
        assert isinstance(client, aioredis.RedisCluster)
        assert await client.ping()
        assert len(client.get_primaries()) == 3  # it learnt the cluster from the nodes
    finally:
        await client.aclose()
    sync = connect_blocking(redis_cluster.url)
    try:
        assert isinstance(sync, RedisCluster) and len(sync.get_primaries()) == 3
    finally:
        sync.close()


@pytest.fixture
async def proto(redis_cluster: RedisClusterNodes, key_prefix: str) -> AsyncIterator[TurnProtocol]:
    async with open_protocol(redis_cluster.url, key_prefix) as protocol:
        yield protocol


async def test_the_sweep_finds_stranded_turns_on_every_primary(
    proto: TurnProtocol, redis_cluster: RedisClusterNodes
) -> None:
    cids = redis_cluster.conversations_on_every_primary(proto.keys.prefix, 3)
    for cid in cids:
        await proto.submit(cid, "t1", agent="a", message=Message.user("hi"), options={})
    # No worker holds a lease: every one of them is a candidate, whichever node it is on.
    assert sorted(await proto.sweep_candidates()) == sorted(cids)
    assert await proto.parked_turns() == []  # scans them too; none awaits approval


async def test_registry_and_epoch_work_across_slots(
    proto: TurnProtocol, redis_cluster: RedisClusterNodes
) -> None:
    client = redis_cluster.client()
    try:
        slots = {client.keyslot(k) for k in (proto.keys.agents(), proto.keys.epoch())}
        assert len(slots) == 2  # deployment-wide keys are on different slots
        client.sadd(proto.keys.agents(), "bot")
        client.sadd(proto.keys.prefixes(), proto.keys.prefix)
    finally:
        client.close()
    assert await proto.registered_agents() == frozenset({"bot"})
    assert proto.keys.prefix in await proto.registered_prefixes()
    epoch = await proto.check_epoch(None)
    assert await proto.check_epoch(epoch) == epoch


async def test_clear_removes_every_key_of_a_conversation_on_its_node(
    redis_cluster: RedisClusterNodes, key_prefix: str
) -> None:
    memory = RedisConversationMemory(redis_cluster.url, prefix=key_prefix)
    cids = redis_cluster.conversations_on_every_primary(key_prefix, 1)
    try:
        for cid in cids:
            memory.append(cid, [Message.user(f"hello {cid}"), Message.assistant("hi")])
        await memory.aclear(cids[1])
        assert memory.load(cids[1]) == []
        assert [len(memory.load(cid)) for cid in (cids[0], cids[2])] == [2, 2]
    finally:
        await memory.aclose()
    client = redis_cluster.client()
    try:
        left = {k.decode() for k in client.scan_iter(match=f"{key_prefix}:*")}
    finally:
        client.close()
    assert left and not any(f"{{{cids[1]}}}" in k for k in left)


@tool
def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"all about {topic}"


async def test_a_slot_out_of_service_mid_turn_delays_the_turn_without_failing_it(
    redis_cluster: RedisClusterNodes, key_prefix: str
) -> None:
    """The cluster answers CLUSTERDOWN for the conversation's slot for 3 s (longer than
    redis-py's own retries) between two model calls: the turn waits and succeeds."""
    cid = "slot-outage"
    slot, asked = key_slot(cid.encode()), []
    owner = redis_cluster.slot_owner(slot)

    def answer(request: ModelRequest) -> str | Message:
        asked.append(request.messages[-1].role)
        if len(asked) > 1:
            return "done"
        redis_cluster.unserve(slot, owner)
        threading.Timer(3.0, redis_cluster.serve, (slot, owner)).start()
        return Message.assistant("", [ToolCall(id="c1", name="lookup", arguments={"topic": "x"})])

    proto = TurnProtocol.from_url(redis_cluster.url, prefix=key_prefix)
    try:
        await proto.submit(cid, "t1", agent="a", message=Message.user("hi"), options={})
        agent = Agent(ScriptedModel(answer), name="a", tools=[lookup])
        config = RunnerConfig(worker_id="w-test", lease_ms=10_000)
        report = await Runner(proto, Profiles([agent]), config).drain(cid)
        assert report.succeeded == ["t1"] and report.failed == []
        assert asked == [MessageRole.USER, MessageRole.TOOL]  # the model ran once per step
        assert [m.text for m in await proto.history(cid)][-1] == "done"
    finally:
        await proto.close()
        redis_cluster.serve(slot, owner)


async def test_calls_beyond_max_connections_wait_instead_of_failing(
    redis_cluster: RedisClusterNodes,
) -> None:
    """As on one Redis: 8 blocking reads at once through a client allowed 2 connections
    all get their answer (redis-py's cluster client alone raises MaxConnectionsError)."""
    client = connect(redis_cluster.url, max_connections=2)
    stream = "waiting:{same-node}:events"

    async def blocked_read() -> Any:
        return await client.xread({stream: "$"}, block=200)

    async def pipelined() -> Any:
        # As read_events_and_turn sends it: a blocking read and a look at the record.
        async with client.pipeline(transaction=False) as pipe:
            pipe.xread({stream: "$"}, block=200)
            pipe.exists(stream)
            return await pipe.execute()

    try:
        reads = await asyncio.gather(*(blocked_read() for _ in range(8)))
        piped = await asyncio.gather(*(pipelined() for _ in range(4)))
    finally:
        await client.aclose()
    assert all(not reply for reply in reads)  # each read waited its 200 ms and got nothing
    assert all(not read and exists == 0 for read, exists in piped)


@pytest.fixture(scope="module")
def secured_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    """A cluster with a password, speaking TLS only (clients, replication, its bus)."""
    cli = services.redis_cli()
    directory = tmp_path_factory.mktemp("tls-cluster")
    tls = make_tls_files(directory / "certs", client_auth=True)
    nodes = RedisClusterNodes(directory / "nodes", cli, password="s3cret:/@", tls=tls)
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.stop()


async def test_a_cluster_over_tls_with_a_password_serves_memory_and_turns(
    secured_cluster: RedisClusterNodes, key_prefix: str
) -> None:
    url = secured_cluster.url
    assert url.startswith("rediss+cluster://:s3cret%3A%2F%40@")
    memory = RedisConversationMemory(url, prefix=key_prefix)
    try:
        memory.append("c1", [Message.user("hello"), Message.assistant("hi")])  # sync client
        assert [m.text for m in await memory.aload("c1")] == ["hello", "hi"]  # async client
    finally:
        await memory.aclose()
    async with open_protocol(url, key_prefix) as proto:
        await proto.submit("c2", "t1", agent="a", message=Message.user("q"), options={})
        assert (await proto.get_turn("c2", "t1")).status == "queued"
    plain = url.replace("rediss+cluster://", "redis+cluster://").split("?")[0]
    with pytest.raises(ConfigurationError, match="TLS options need rediss"):
        connect(plain + "?ssl_ca_certs=/x")
    with pytest.raises(ConfigurationError, match="only"):
        connect(url + "&socket_timeout=1")
    with pytest.raises(ConfigurationError, match="not a file"):
        connect(url.split("?")[0] + "?ssl_ca_certs=/no/such/ca.pem")


async def test_a_given_cluster_client_serves_the_memory(
    redis_cluster: RedisClusterNodes, key_prefix: str
) -> None:
    client = aioredis.RedisCluster(host="127.0.0.1", port=redis_cluster.ports[0])
    memory = RedisConversationMemory(client=client, prefix=key_prefix)
    try:
        await memory.aappend("given", [Message.user("hello"), Message.assistant("hi")])
        assert [m.text for m in await memory.aload("given", last_turns=1)] == ["hello", "hi"]
    finally:
        await client.aclose()
    decoding = aioredis.RedisCluster(
        host="127.0.0.1", port=redis_cluster.ports[0], decode_responses=True
    )
    with pytest.raises(ConfigurationError, match="decode_responses=False"):
        RedisConversationMemory(client=decoding, prefix=key_prefix)
    await decoding.aclose()

"""Real worker processes whose store is the 3-primary Redis Cluster and whose Celery
broker is the standalone test redis-server (or RabbitMQ): conversations on every primary
run their turns in order, one at a time, with their memory, also while a slot moves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.cluster import RedisCluster
from redis.crc import key_slot

from convoq.client import Client
from convoq.errors import ConfigurationError
from convoq.messages import MessageRole
from tests.support import services
from tests.support.gateway import running_gateway
from tests.support.rabbitmq import AMQP_URL, delete_amqp_queues
from tests.support.redis_cluster import RedisClusterNodes
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool, running_pool, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool(
    redis_cluster: RedisClusterNodes,
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerPool]:
    logs = tmp_path_factory.mktemp("cluster-workers")
    with running_pool(
        redis_cluster.url, logs, 2, broker_url=redis_server.url, partitions=4
    ) as started:
        yield started


@pytest.fixture(scope="module")
def amqp_pool(
    redis_cluster: RedisClusterNodes, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerPool]:
    services.rabbitmq()
    logs = tmp_path_factory.mktemp("cluster-amqp-workers")
    with running_pool(redis_cluster.url, logs, 1, broker_url=AMQP_URL, partitions=2) as started:
        yield started
    delete_amqp_queues(started)


@pytest.mark.parametrize("broker", ["redis", "amqp"])
def test_turns_on_every_primary_run_in_order_with_their_memory(
    broker: str, request: pytest.FixtureRequest, redis_cluster: RedisClusterNodes
) -> None:
    pool: WorkerPool = request.getfixturevalue("pool" if broker == "redis" else "amqp_pool")
    conversations = redis_cluster.conversations_on_every_primary(pool.prefix, 4)
    turns = 5
    with pool.client() as client:
        handles = {cid: [] for cid in conversations}  # type: dict[str, list[object]]
        for turn in range(turns):
            for cid in conversations:
                handles[cid].append(client.submit(cid, f"{cid} t{turn}", agent="tracker"))
        for cid in conversations:
            assert [h.wait(60).status for h in handles[cid]] == ["succeeded"] * turns  # type: ignore[attr-defined]
        test_data = redis_cluster.client()
        try:
            assert test_data.smembers(f"{pool.prefix}:test:overlap") == set()
            for cid in conversations:
                expected = [f"{cid} t{turn}" for turn in range(turns)]
                ran = test_data.lrange(f"{pool.prefix}:test:order:{cid}", 0, -1)
                assert [x.decode() for x in ran] == expected
                users = [m.text for m in client.history(cid) if m.role == MessageRole.USER]
                assert users == expected
        finally:
            test_data.close()
        # Memory: the model of a later turn saw the earlier ones, read from the cluster.
        cid = conversations[0]
        assert (
            client.submit(cid, "and now?", agent="echo")
            .wait(30)
            .text.endswith(f"{cid} t{turns - 1} | and now?")
        )
    # The workers registered on the cluster (the registry keys span several slots).
    assert pool.workers and all(w.alive() for w in pool.workers)


def test_a_client_on_a_cluster_without_a_broker_says_to_set_one(
    redis_cluster: RedisClusterNodes,
) -> None:
    with (
        pytest.raises(ConfigurationError, match="CONVOQ_BROKER_URL"),
        Client(redis_cluster.url, prefix="nobroker") as client,
    ):
        client.submit("c1", "hi", agent="echo")


def test_a_hot_slot_moves_between_primaries_while_its_turns_run(
    pool: WorkerPool, redis_cluster: RedisClusterNodes
) -> None:
    """MOVED and ASK mid-run: the hot conversation's slot goes to another primary twice
    while its turns run; every turn runs once, in order, and is stored once."""
    hot = redis_cluster.conversations_on_every_primary(pool.prefix, 1)[0]
    test_data = redis_cluster.client()
    slot = test_data.keyslot(f"{pool.prefix}:{{{hot}}}:inbox")
    order = f"{pool.prefix}:test:order:{hot}"
    turns, expected = 60, [f"{hot} t{turn}" for turn in range(60)]
    try:
        with pool.client() as client:
            handles = [client.submit(hot, text, agent="tracker") for text in expected]
            moved_at = []
            for after, target in zip([5, 25], _other_primaries(redis_cluster, slot), strict=True):
                moved_at.append(wait_until(lambda a=after: _ran(test_data, order, a), 60))
                redis_cluster.migrate_slot(slot, target)
            assert redis_cluster.slot_owner(slot) == target
            assert [h.wait(60).status for h in handles] == ["succeeded"] * turns
            assert any(n < turns for n in moved_at)  # a move met turns still to run
            users = [m.text for m in client.history(hot) if m.role == MessageRole.USER]
            assert users == expected  # each turn stored once, in order
        ran = [x.decode() for x in test_data.lrange(order, 0, -1)]
        assert ran == expected  # each turn's model ran once, in order
        assert test_data.smembers(f"{pool.prefix}:test:overlap") == set()
    finally:
        test_data.close()


def test_a_turn_ending_while_its_slot_is_held_mid_move_runs_its_model_once(
    pool: WorkerPool, redis_cluster: RedisClusterNodes
) -> None:
    """A slot stuck half moved answers TRYAGAIN for longer than redis-py's redirection
    budget (it then raises "TTL exhausted"): the commit waits for the move under its lease
    instead of leaving the turn to run again."""
    cid = redis_cluster.conversations_on_every_primary(pool.prefix, 1)[0]
    test_data = redis_cluster.client()
    slot = test_data.keyslot(f"{pool.prefix}:{{{cid}}}:inbox")
    ran, release = f"{pool.prefix}:test:ran:{cid}", f"{pool.prefix}:test:release:{cid}"
    try:
        with pool.client() as client:
            handle = client.submit(cid, f"{cid} held", agent="blocker")
            wait_until(lambda: test_data.llen(ran) == 1, 30, what="the model to start")
            retried = f"ending of turn {handle.turn_id} failed, retrying while the lease holds"
            with redis_cluster.slot_held_mid_move(slot, _other_primaries(redis_cluster, slot)[0]):
                test_data.set(release, "1")
                # The move completes once the commit has been refused past the budget.
                wait_until(lambda: retried in pool.logs(), 4, what="the commit to retry")
            assert handle.wait(60).status == "succeeded"
            assert test_data.llen(ran) == 1  # the model ran once
            assert [m.text for m in client.history(cid)] == [f"{cid} held", f"released {cid} held"]
    finally:
        test_data.close()


def _ran(test_data: RedisCluster, order: str, at_least: int) -> int:
    """How many turns the tracker saw start, once at least ``at_least`` (else 0)."""
    count = int(test_data.llen(order))
    return count if count >= at_least else 0


def _other_primaries(nodes: RedisClusterNodes, slot: int) -> list[int]:
    """The two primaries that do not serve ``slot``: the targets of its moves."""
    owner = nodes.slot_owner(slot)
    return [port for port in nodes.primaries() if port != owner]


def test_the_gateway_serves_turns_from_a_cluster_and_answers_503_while_a_slot_is_down(
    pool: WorkerPool, redis_cluster: RedisClusterNodes, tmp_path: Path
) -> None:
    cid = redis_cluster.conversations_on_every_primary(pool.prefix, 1)[0]
    turns = f"/v1/conversations/{cid}/turns"
    slot = key_slot(cid.encode())
    owner = redis_cluster.slot_owner(slot)
    with (
        running_gateway(pool, tmp_path, callback_allowed_networks="") as gateway,
        gateway.client() as http,
    ):
        submitted = http.post(turns, json={"message": "hello", "agent": "echo"})
        assert submitted.status_code == 202, submitted.text
        tid = submitted.json()["turn_id"]
        done = http.get(f"{turns}/{tid}", params={"wait": 30})
        assert done.status_code == 200 and done.json()["status"] == "succeeded", done.text
        redis_cluster.unserve(slot, owner)
        try:
            down = http.get(f"{turns}/{tid}")
        finally:
            redis_cluster.serve(slot, owner)
        assert down.status_code == 503, down.text
        assert down.json()["title"] == "RedisUnavailable"
        assert http.get(f"{turns}/{tid}").json()["status"] == "succeeded"  # back again

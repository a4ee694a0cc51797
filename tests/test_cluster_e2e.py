"""Real worker processes whose store is the 3-primary Redis Cluster and whose Celery
broker is the standalone test redis-server: conversations on every primary run their
turns in order, one at a time, with their memory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from convoq.client import Client
from convoq.errors import ConfigurationError
from convoq.messages import MessageRole
from tests.support.redis_cluster import RedisClusterNodes
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool, running_pool

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


def test_turns_on_every_primary_run_in_order_with_their_memory(
    pool: WorkerPool, redis_cluster: RedisClusterNodes
) -> None:
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
    assert len(pool.workers) == 2 and all(w.alive() for w in pool.workers)


def test_a_client_on_a_cluster_without_a_broker_says_to_set_one(
    redis_cluster: RedisClusterNodes,
) -> None:
    with (
        pytest.raises(ConfigurationError, match="CONVOQ_BROKER_URL"),
        Client(redis_cluster.url, prefix="nobroker") as client,
    ):
        client.submit("c1", "hi", agent="echo")

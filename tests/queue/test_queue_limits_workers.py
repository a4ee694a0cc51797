"""Queued-turn limits with real worker processes and a real gateway: a worker uncounts
each turn it ends (so the next submit fits again at once), a client's cancel uncounts the
turn, and the gateway answers a full queue with 429 and ``Retry-After``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client import REGISTRY

from convoq.errors import QueueFullError
from convoq.redis.keys import KeySchema
from tests.support.gateway import running_gateway
from tests.support.workers import WorkerPool, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def limited(
    store_url: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[WorkerPool]:
    """One worker with a per-agent limit of 2, on one redis-server or on the Redis Cluster
    (the standalone server is then the broker): the counts sit in another slot than the
    conversations."""
    # The clients of this test resolve the limit from the environment, as the workers do.
    monkeypatch.setenv("CONVOQ_MAX_QUEUED_PER_AGENT", "2")
    broker = redis_url if store_url != redis_url else None
    pool = WorkerPool(
        store_url,
        tmp_path,
        agents="tests.support.fair_agents",
        max_queued_per_agent=2,
        broker_url=broker,
    )
    pool.start()
    yield pool
    pool.stop_all()


def _refused(agent: str, limit: str) -> float:
    labels = {"agent": agent, "limit": limit}
    return REGISTRY.get_sample_value("convoq_submits_refused_total", labels) or 0.0


def _cid(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:6]}"


def test_a_worker_frees_each_place_when_its_turn_ends(
    limited: WorkerPool, store_client: redis.Redis
) -> None:
    counts = KeySchema(limited.prefix).queue_keys()[1]
    with limited.client() as client:
        first = client.submit(_cid("a"), "one", agent="slow")
        second = client.submit(_cid("b"), "two", agent="slow")
        with pytest.raises(QueueFullError) as caught:
            client.submit(_cid("c"), "three", agent="slow")
        assert caught.value.limit == "agent"
        assert first.wait(30).ok and second.wait(30).ok
        # Ended on the worker and uncounted there, just after the result was stored (the
        # reconciling sweep would wait a minute).
        wait_until(lambda: not store_client.hgetall(counts), 10, what="the places freed")
        third = client.submit(_cid("c"), "three", agent="slow")
        assert third.wait(30).ok
    wait_until(lambda: not store_client.hgetall(counts), 10, what="the last place freed")


def test_a_cancelled_turn_frees_its_place(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVOQ_MAX_QUEUED_PER_AGENT", "2")
    idle = WorkerPool(redis_url, tmp_path)  # no worker: nothing ends but by the cancel
    cid = _cid("cancel")
    with idle.client() as client:
        client.submit(cid, "one", agent="slow")
        queued = client.submit(cid, "two", agent="slow")
        refused = _refused("slow", "agent")
        with pytest.raises(QueueFullError):
            client.submit(cid, "three", agent="slow")
        assert _refused("slow", "agent") == refused + 1  # the client's metric counts it
        assert client.cancel(queued) == "cancelled"
        client.submit(cid, "three", agent="slow")


def test_the_gateway_answers_a_full_queue_429_with_retry_after(
    redis_url: str, tmp_path: Path
) -> None:
    idle = WorkerPool(redis_url, tmp_path)  # no worker: turns stay queued
    cid = _cid("gw")
    with (
        running_gateway(idle, tmp_path, max_queued_per_conversation="1") as gateway,
        gateway.client() as http,
    ):
        body = {"message": "one", "agent": "echo"}
        assert http.post(f"/v1/conversations/{cid}/turns", json=body).status_code == 202
        full = http.post(f"/v1/conversations/{cid}/turns", json={**body, "message": "2"})
        documented = http.get("/openapi.json").json()["paths"]["/v1/conversations/{cid}/turns"]
    assert full.status_code == 429, full.text
    assert "429" in documented["post"]["responses"]
    assert full.headers["content-type"] == "application/problem+json"
    assert full.headers["retry-after"] == "1"
    problem = full.json()
    assert problem["title"] == "QueueFullError"
    assert problem["error"]["details"]["limit"] == "conversation"
    r = redis.Redis.from_url(redis_url)
    assert r.llen(f"{idle.prefix}:{{{cid}}}:inbox") == 1  # the refused turn stored nothing
    r.close()

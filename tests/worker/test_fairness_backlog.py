"""Fairness at scale: a conversation with 1,000 queued turns does not starve the others on
its partition. One real worker process with one slot and one partition, so every kick
shares one queue and one slot: without fair slots the busy conversation would run all its
turns before anyone else's. Bounded: an instant scripted model, one previous turn per
window (about 1,000 short turns in all)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from convoq.redis.keys import KeySchema
from tests.support.workers import WorkerPool

pytestmark = pytest.mark.slow
BACKLOG = 1000


@pytest.fixture
def one_slot(redis_url: str, tmp_path: Path) -> Iterator[WorkerPool]:
    pool = WorkerPool(
        redis_url,
        tmp_path,
        agents="tests.support.backlog_agents",
        partitions=1,
        concurrency=1,
    )
    pool.start()
    yield pool
    pool.stop_all()


def test_others_finish_while_a_thousand_turn_conversation_drains(
    one_slot: WorkerPool, redis_client: redis.Redis
) -> None:
    hog = f"hog-{uuid.uuid4().hex[:6]}"
    others = [f"other{n}-{uuid.uuid4().hex[:6]}" for n in range(5)]
    keys = KeySchema(one_slot.prefix)
    with one_slot.client() as client:
        backlog = [client.submit(hog, f"turn {n}", agent="quick") for n in range(BACKLOG)]
        waiting = [client.submit(cid, "me too", agent="quick") for cid in others]
        for handle in waiting:
            assert handle.wait(120).ok
        # Each of the others finished while the busy conversation still had turns queued.
        assert redis_client.llen(keys.inbox(hog)) > 0
        assert backlog[-1].status() in ("queued", "running")
        for handle in backlog:
            assert handle.wait(300).ok
    # The busy one kept its order, each turn stored once.
    stored = client_history(one_slot, hog)
    assert stored == [text for n in range(BACKLOG) for text in (f"turn {n}", f"ok turn {n}")]


def client_history(pool: WorkerPool, cid: str) -> list[str]:
    with pool.client() as client:
        return [m.text for m in client.history(cid)]

"""Changing the partition count of a running deployment, workers rolled one at a time (the
procedure on the docs' Redis page, docs/redis.md): nothing queued is lost or stranded. Up
(4 -> 8): every new worker also consumes the old queues, clients switch once one runs the
new count (the client's check refuses it before). Down (8 -> 4): kicks a client still on
the old count sends to a queue nobody consumes any more are made good by the sweeper."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from convoq.client import Client
from convoq.errors import ConfigurationError
from convoq.queue import routing
from tests.support.workers import WorkerPool, WorkerProcess

pytestmark = pytest.mark.slow
AGENT = "brief"


@pytest.fixture
def pool(redis_url: str, tmp_path: Path) -> Iterator[WorkerPool]:
    started = WorkerPool(redis_url, tmp_path, agents="tests.support.backlog_agents", concurrency=4)
    yield started
    started.stop_all()


def workers_at(pool: WorkerPool, partitions: int, count: int) -> list[WorkerProcess]:
    env = {**pool.env, "CONVOQ_PARTITIONS": str(partitions)}
    started = [WorkerProcess(env, pool.log_dir).start() for _ in range(count)]
    pool.workers.extend(started)
    return [worker.wait_ready() for worker in started]


def roll(pool: WorkerPool, old: list[WorkerProcess], partitions: int) -> Iterator[None]:
    """Replace each of ``old`` by a worker at ``partitions``: warm stop, then start."""
    for worker in old:
        worker.stop()
        pool.workers.remove(worker)
        workers_at(pool, partitions, 1)
        yield


def client_at(pool: WorkerPool, partitions: int) -> Client:
    return Client(pool.redis_url, prefix=pool.prefix, partitions=partitions)


class Ledger:
    """Every turn submitted (by whichever client), per conversation, in order."""

    def __init__(self, label: str, conversations: int) -> None:
        self.cids = [f"{label}{n}-{uuid.uuid4().hex[:6]}" for n in range(conversations)]
        self.sent: dict[str, list[str]] = {cid: [] for cid in self.cids}
        self.turns: list[tuple[str, str]] = []

    def submit_round(self, client: Client, tag: str) -> None:
        for cid in self.cids:
            text = f"{tag} {len(self.sent[cid])}"
            handle = client.submit(cid, text, agent=AGENT)
            self.turns.append((cid, handle.turn_id))
            self.sent[cid].append(text)

    def check_all_finished(self, client: Client) -> None:
        # Followed through one client: the others may be closed by now.
        for cid, tid in self.turns:
            assert client.handle(cid, tid).wait(90).ok
        for cid, texts in self.sent.items():
            stored = [m.text for m in client.history(cid)]
            assert stored == [t for text in texts for t in (text, f"ok {text}")]


def test_rolling_workers_up_from_4_to_8_partitions_loses_nothing(pool: WorkerPool) -> None:
    old = workers_at(pool, 4, 2)
    ledger = Ledger("up", 24)
    with client_at(pool, 4) as before, client_at(pool, 8) as early:
        for _ in range(4):
            ledger.submit_round(before, "old")
        # No live worker runs 8 partitions yet: a client set to 8 is refused, not stranded.
        with pytest.raises(ConfigurationError, match="live workers use"):
            early.submit(ledger.cids[0], "too early", agent=AGENT)
        for step, _ in enumerate(roll(pool, old, 8)):
            with client_at(pool, 8) as after:  # accepted once one worker runs 8
                ledger.submit_round(after, f"new{step}")
            ledger.submit_round(before, f"old{step}")  # old clients keep working
        ledger.submit_round(before, "late")  # p0..p3 are consumed by the new workers too
        ledger.check_all_finished(before)
    assert {w.env["CONVOQ_PARTITIONS"] for w in pool.workers} == {"8"}


def test_rolling_down_from_8_to_4_kicks_what_old_clients_strand(
    pool: WorkerPool, redis_client: redis.Redis
) -> None:
    old = workers_at(pool, 8, 2)
    ledger = Ledger("down", 24)
    high = [cid for cid in ledger.cids if routing.partition_of(cid, 8) >= 4]
    assert high  # some conversations live on the partitions that go away
    with client_at(pool, 8) as before:
        ledger.submit_round(before, "old")
        for step, _ in enumerate(roll(pool, old, 4)):
            ledger.submit_round(before, f"old{step}")
        # Every worker runs 4 now; this client (checked before) still sends to p4..p7.
        ledger.submit_round(before, "stranded")
        ledger.check_all_finished(before)
    # Those kicks are still in queues nobody consumes; the sweeper ran the turns anyway.
    stranded = sum(redis_client.llen(routing.queue_name(pool.prefix, p)) for p in range(4, 8))
    assert stranded > 0

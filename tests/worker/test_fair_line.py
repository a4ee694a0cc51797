"""Fair slots across partitions and the process's own line, with real worker processes:
kicks waiting for a slot wait in the worker in the order they came, whichever partition
queue they came from; a conversation that gives its slot up goes back in that line
without a broker message; a worker killed with conversations in its line loses none."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from convoq.queue.routing import partition_of, queue_name
from convoq.redis.keys import KeySchema
from convoq.settings import ConvoqSettings
from convoq.worker.app import worker_config
from tests.support.workers import WorkerPool, WorkerProcess, broker_pushes, wait_until

# Run again with the fast paths off by `make test-slowpaths`.
pytestmark = pytest.mark.slowpaths

AGENTS = "tests.support.fair_agents"  # "slow": 0.3 s per turn
TURNS = 3


@pytest.fixture
def one_slot(redis_url: str, tmp_path: Path) -> Iterator[WorkerPool]:
    pool = WorkerPool(redis_url, tmp_path, concurrency=1, partitions=2, agents=AGENTS)
    pool.start()
    yield pool
    pool.stop_all()


@pytest.fixture
def gated_slot(redis_url: str, tmp_path: Path) -> Iterator[WorkerPool]:
    """One slot whose sweeper waits an hour: the sweeper re-kicks every conversation that
    waits with no lease, and those waiting in the worker's line have none. A re-kick sent
    before the test saw the queues empty would stay in the broker (the worker already holds
    all the kicks its slot may), and the gate would never open."""
    pool = WorkerPool(
        redis_url, tmp_path, concurrency=1, partitions=2, agents=AGENTS, sweep_interval_s=3600
    )
    pool.start()
    yield pool
    pool.stop_all()


def ids_in(partition: int, count: int, partitions: int = 2) -> list[str]:
    """``count`` conversation ids routed to ``partition``."""
    found = (f"c{n}-{uuid.uuid4().hex[:6]}" for n in itertools.count())
    chosen = (cid for cid in found if partition_of(cid, partitions) == partition)
    return list(itertools.islice(chosen, count))


def submit_rounds(
    pool: WorkerPool, cids: list[str], gate: redis.Redis | None = None
) -> dict[str, list[object]]:
    """``TURNS`` turns for each conversation, all queued at once; waits for all. With a
    ``gate`` (the test Redis): the turns run the ``gated`` profile, and the gate opens
    only once every kick left the broker for the worker's own line."""
    agent = "gated" if gate is not None else "slow"
    with pool.client() as client:
        handles = {cid: [client.submit(cid, f"{cid} {n}", agent=agent) for n in range(TURNS)]
                   for cid in cids}  # fmt: skip
        if gate is not None:
            queues = [queue_name(pool.prefix, p) for p in (0, 1)]
            wait_until(lambda: sum(gate.llen(q) for q in queues) == 0, 30,
                       what="every kick taken by the worker")  # fmt: skip
            gate.set(f"{pool.prefix}:test:fair:open", "1")
        for group in handles.values():
            for handle in group:
                assert handle.wait(60).ok  # type: ignore[attr-defined]
    return handles


def started_ms(r: redis.Redis, pool: WorkerPool, handle: object) -> int:
    cid, tid = handle.conversation_id, handle.turn_id  # type: ignore[attr-defined]
    return int(r.hget(KeySchema(pool.prefix).turn(cid, tid), "started_ms"))


@pytest.mark.fast_paths  # the order of the process's own line
def test_a_quiet_partition_gets_no_more_turns_than_a_crowded_one(
    gated_slot: WorkerPool, redis_client: redis.Redis
) -> None:
    # Three conversations on partition 0, one on partition 1, one slot. The consumer serves
    # the partition queues in turn: were the kicks left there, the lone conversation of
    # partition 1 would get every other turn and finish before the others had their second.
    cids = [*ids_in(0, 3), *ids_in(1, 1)]
    handles = submit_rounds(gated_slot, cids, gate=redis_client)
    rounds = [[started_ms(redis_client, gated_slot, group[n]) for group in handles.values()]
              for n in range(TURNS)]  # fmt: skip
    # Every conversation had its n-th turn before any had its (n+1)-th.
    for earlier, later in itertools.pairwise(rounds):
        assert max(earlier) < min(later)


def test_a_worker_holds_four_kicks_per_slot() -> None:
    config = worker_config(ConvoqSettings(concurrency=3, fast_paths=True), "redis://x")
    assert (config["worker_concurrency"], config["worker_prefetch_multiplier"]) == (3, 4)


def test_with_the_fast_paths_off_a_worker_holds_no_kick_beyond_its_slots() -> None:
    # No line of its own to count them: waiting conversations stay in the broker.
    config = worker_config(ConvoqSettings(concurrency=3, fast_paths=False), "redis://x")
    assert (config["worker_concurrency"], config["worker_prefetch_multiplier"]) == (3, 1)


@pytest.mark.fast_paths  # the process's own line is what spares the broker message
def test_a_conversation_that_gives_its_slot_up_needs_no_broker_message(
    gated_slot: WorkerPool, redis_client: redis.Redis
) -> None:
    cids = [*ids_in(0, 1), *ids_in(1, 1)]
    with broker_pushes(redis_client, gated_slot) as pushes:
        handles = submit_rounds(gated_slot, cids, gate=redis_client)
        published = pushes()
    keys = KeySchema(gated_slot.prefix)
    # Both took turns (each gave the slot up twice), yet the only messages were the two
    # kicks the client sent when each conversation's first turn found it idle.
    first = [started_ms(redis_client, gated_slot, group[0]) for group in handles.values()]
    second = [started_ms(redis_client, gated_slot, group[1]) for group in handles.values()]
    assert max(first) < min(second)
    assert published == len(cids)
    assert not any(redis_client.exists(keys.lease(cid)) for cid in cids)


def test_a_worker_killed_with_conversations_in_its_line_loses_none(
    one_slot: WorkerPool, redis_client: redis.Redis
) -> None:
    cids = [*ids_in(0, 2), *ids_in(1, 1)]
    with one_slot.client() as client:
        handles = [[client.submit(cid, f"{cid} {n}", agent="slow") for n in range(TURNS)]
                   for cid in cids]  # fmt: skip
        # The first turn is stored: its conversation now waits in the worker's line (the
        # others' kicks ahead of it), holding its lease.
        assert handles[0][0].wait(60).ok
        one_slot.workers[0].kill()
        one_slot.start()  # its sweeper kicks the conversations once their leases lapse
        for group in handles:
            for handle in group:
                assert handle.wait(60).ok
        for cid in cids:
            stored = [m.text for m in client.history(cid)]
            assert stored == [text for n in range(TURNS) for text in (f"{cid} {n}",
                              f"done {cid} {n}")]  # fmt: skip


def test_a_warm_stop_hands_its_line_to_other_workers_with_the_leases(
    redis_url: str, tmp_path: Path
) -> None:
    # Leases far longer than the waits below: were the conversation in the stopping
    # worker's line left to its lease, no other worker could run it in time.
    pool = WorkerPool(
        redis_url, tmp_path, concurrency=1, partitions=2, agents=AGENTS, lease_ms=120_000
    )
    try:
        (stopping,) = pool.start()
        busy, other = [*ids_in(0, 1), *ids_in(1, 1)]
        with pool.client() as client:
            queued = [client.submit(busy, f"{busy} {n}", agent="slow") for n in range(TURNS)]
            waiting = client.submit(other, f"{other} 0", agent="slow")
            assert queued[0].wait(60).ok  # now behind the other one, in the worker's line
            stopping.stop()
            pool.start()
            for handle in [*queued, waiting]:
                assert handle.wait(30).ok
            assert [m.text for m in client.history(busy)] == [
                text for n in range(TURNS) for text in (f"{busy} {n}", f"done {busy} {n}")
            ]
    finally:
        pool.stop_all()


class CeleryWorkerHoldingNone(WorkerProcess):
    """``celery worker --prefetch-multiplier=1``: no kick held beyond its slots."""

    def command(self) -> list[str]:
        return [*super().command(), "--prefetch-multiplier=1"]


def test_with_no_kick_held_beyond_the_slots_it_goes_back_through_the_broker(
    redis_url: str, tmp_path: Path, redis_client: redis.Redis
) -> None:
    pool = WorkerPool(redis_url, tmp_path, concurrency=1, partitions=2, agents=AGENTS)
    worker = CeleryWorkerHoldingNone(pool.env, tmp_path, use_celery_cli=True)
    pool.workers.append(worker)
    try:
        worker.start().wait_ready()
        cids = [*ids_in(0, 1), *ids_in(1, 1)]
        with broker_pushes(redis_client, pool) as pushes:
            handles = submit_rounds(pool, cids)
            published = pushes()
        # The window (one kick) is full while a turn runs: each conversation that gave the
        # slot up went back through the broker, behind the kick waiting there.
        assert published > len(cids)
        first = [started_ms(redis_client, pool, group[0]) for group in handles.values()]
        second = [started_ms(redis_client, pool, group[1]) for group in handles.values()]
        assert max(first) < min(second)
    finally:
        pool.stop_all()

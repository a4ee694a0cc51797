"""Fair slots: while other conversations wait, a drain gives its slot up after each turn
and sends its conversation back in line, keeping the lease (same fence) for the drain that
picks the kick up; a worker whose slots are not all busy never asks. The runner in this
process against a real redis-server; the end-to-end order is checked with a real worker
process of one slot."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from convoq import Agent
from convoq.models import ScriptedModel
from convoq.redis import KeySchema, TurnProtocol
from convoq.worker._fair import Kept, SlotBacklog
from convoq.worker.profiles import Profiles
from convoq.worker.runner import Runner, RunnerConfig
from tests.support.protocol_helpers import submit_all
from tests.support.workers import WorkerPool

CID = "fair-1"


class Waiting:
    """Fairness whose answer the test sets; requeues are recorded (or refused)."""

    def __init__(self, waiting: bool, *, refuse: bool = False) -> None:
        self.waiting, self.refuse = waiting, refuse
        self.requeued: list[tuple[str, str, int]] = []

    async def others_waiting(self) -> bool:
        return self.waiting

    async def requeue(self, conversation_id: str, head: str, fence: int) -> None:
        if self.refuse:
            raise ConnectionError("broker down")
        self.requeued.append((conversation_id, head, fence))


def runner(proto: TurnProtocol, fairness: Waiting, *, lease_ms: int = 30_000) -> Runner:
    echo = Agent(ScriptedModel(lambda request: f"seen {request.messages[-1].text}"), name="bot")
    config = RunnerConfig(worker_id="w-test", lease_ms=lease_ms)
    return Runner(proto, Profiles([echo]), config, fairness=fairness)


async def test_a_drain_moves_on_after_each_turn_while_others_wait(proto: TurnProtocol) -> None:
    await submit_all(proto, CID, "t1", "t2", "t3")
    fair = Waiting(True)
    first = await runner(proto, fair).drain(CID)
    assert (first.succeeded, first.requeued) == (["t1"], ["t2"])
    ((cid, head, fence),) = fair.requeued
    assert (cid, head) == (CID, "t2")
    # The lease stays kept for the requeued kick: a kick without its fence gets nothing.
    assert (await runner(proto, Waiting(False)).drain(CID)).idle
    assert (await proto.get_turn(CID, "t2")).status == "queued"
    second = await runner(proto, fair).drain(CID, head="t2", fence=fence)
    assert (second.succeeded, second.requeued) == (["t2"], ["t3"])
    assert fair.requeued[-1][2] == fence  # one lease throughout
    last = await runner(proto, Waiting(False)).drain(CID, head="t3", fence=fence)
    assert (last.succeeded, last.requeued) == (["t3"], [])
    assert not await proto.redis.exists(proto.keys.lease(CID))
    assert [m.text for m in await proto.history(CID)] == [
        "t1", "seen t1", "t2", "seen t2", "t3", "seen t3"
    ]  # fmt: skip


async def test_a_lease_that_lapsed_while_its_conversation_waited_is_taken_anew(
    proto: TurnProtocol,
) -> None:
    await submit_all(proto, CID, "t1", "t2")
    fair = Waiting(True)
    assert (await runner(proto, fair, lease_ms=600_000).drain(CID)).requeued == ["t2"]
    ((_, head, fence),) = fair.requeued
    lease = proto.keys.lease(CID)
    # Nothing renews a kept lease, so it lapses; its lapse is the key going (its PX),
    # done here rather than raced against a short lease.
    assert 0 < await proto.redis.pttl(lease) <= 600_000
    assert await proto.redis.delete(lease) == 1
    report = await runner(proto, Waiting(False)).drain(CID, head=head, fence=fence)
    assert report.succeeded == ["t2"]
    # Under a new lease: the fence counter moved past the kept one.
    assert int(await proto.redis.hget(proto.keys.meta(CID), "fence")) > fence
    assert [m.text for m in await proto.history(CID)] == ["t1", "seen t1", "t2", "seen t2"]


async def test_a_lone_conversation_keeps_its_slot(proto: TurnProtocol) -> None:
    await submit_all(proto, CID, "t1", "t2", "t3")
    report = await runner(proto, Waiting(False)).drain(CID)
    assert (report.succeeded, report.requeued) == (["t1", "t2", "t3"], [])


async def test_a_requeue_that_cannot_be_sent_runs_the_turn_here(proto: TurnProtocol) -> None:
    await submit_all(proto, CID, "t1", "t2")
    report = await runner(proto, Waiting(True, refuse=True)).drain(CID)
    assert (report.succeeded, report.requeued) == (["t1", "t2"], [])


async def test_the_broker_is_asked_only_while_every_slot_is_busy() -> None:
    counts: list[int] = []

    def queued() -> int:
        counts.append(1)
        return 3

    backlog = SlotBacklog(2, queued, lambda cid, head, fence: None, refresh_s=0)
    with backlog.slot():
        assert not await backlog.others_waiting()
        assert counts == []
        with backlog.slot():
            assert await backlog.others_waiting()
    assert counts == [1]


def test_a_direct_drain_takes_a_free_slot_only() -> None:
    backlog = SlotBacklog(2, lambda: 0, lambda cid, head, fence: None)
    assert backlog.take_free_slot() and backlog.take_free_slot()
    assert not backlog.take_free_slot()  # both slots held
    backlog.release(direct=True)
    assert backlog.take_free_slot()


def _enter_slot(backlog: SlotBacklog) -> threading.Event:
    """A pool thread entering ``backlog.slot()``; the event is set once it is in."""
    entered = threading.Event()

    def run() -> None:
        with backlog.slot():
            entered.set()

    threading.Thread(target=run, daemon=True).start()
    return entered


async def test_a_pool_drain_waits_for_the_slot_a_direct_drain_holds() -> None:
    backlog = SlotBacklog(1, lambda: 0, lambda cid, head, fence: None, refresh_s=0)
    assert backlog.take_free_slot()
    entered = _enter_slot(backlog)
    assert not entered.wait(0.3)
    # It waits for a slot: the runner's drains yield to it, and a new kick goes behind it.
    assert await backlog.others_waiting()
    backlog.release(direct=True)
    assert entered.wait(5)
    assert backlog.take_free_slot()


def test_a_pool_drain_stops_waiting_at_shutdown() -> None:
    backlog = SlotBacklog(1, lambda: 0, lambda cid, head, fence: None)
    assert backlog.take_free_slot()
    entered = _enter_slot(backlog)
    assert not entered.wait(0.3)
    backlog.detach()  # as at warm shutdown: from the signal handler, then a flush
    backlog.flush()
    assert entered.wait(5)  # the runner, shutting down, starts no turn
    assert not backlog.take_free_slot()


class Line:
    """A process line of its own (one pool thread), its runs and broker sends recorded."""

    def __init__(self, *, held: int = 0, window: int = 4) -> None:
        self.pool = ThreadPoolExecutor(1)
        self.ran: list[Kept] = []
        self.sent: list[tuple[str, str, int]] = []
        self.backlog = SlotBacklog(
            1, lambda: 0, lambda *kick: self.sent.append(kick), window=window, held=lambda: held
        )
        self.backlog.attach(self.pool.submit, self.ran.append)

    def settle(self) -> None:
        self.pool.shutdown(wait=True)


async def test_a_conversation_goes_back_in_the_process_line_not_the_broker() -> None:
    line = Line()
    hold = threading.Event()
    line.pool.submit(hold.wait)  # the one pool thread is busy: the line waits
    with line.backlog.slot():
        assert not await line.backlog.others_waiting()
        await line.backlog.requeue("c1", "t2", 7)
        # Queued in the line, it waits for the slot (the broker count says none).
        assert await line.backlog.others_waiting()
    hold.set()
    line.settle()
    assert (line.ran, line.sent) == ([Kept("c1", "t2", 7)], [])


async def test_without_a_line_of_its_own_it_goes_back_through_the_broker() -> None:
    # A pool other than threads: nothing was attached.
    sent: list[tuple[str, str, int]] = []
    backlog = SlotBacklog(1, lambda: 0, lambda *kick: sent.append(kick))
    await backlog.requeue("c1", "t2", 7)
    assert sent == [("c1", "t2", 7)]


async def test_a_kick_does_not_start_directly_ahead_of_the_line() -> None:
    line = Line()
    hold = threading.Event()
    line.pool.submit(hold.wait)  # the one pool thread is busy: the line waits
    await line.backlog.requeue("c1", "t2", 7)
    assert not line.backlog.take_free_slot()
    hold.set()
    line.settle()
    assert line.ran == [Kept("c1", "t2", 7)]


async def test_a_full_window_sends_it_through_the_broker() -> None:
    # Kicks may wait in the broker: one sent back goes behind them, not ahead.
    line = Line(held=4, window=4)
    await line.backlog.requeue("c1", "t2", 7)
    line.settle()
    assert (line.ran, line.sent) == ([], [("c1", "t2", 7)])


async def test_at_shutdown_the_line_goes_to_the_broker_in_order() -> None:
    line = Line()
    hold = threading.Event()
    line.pool.submit(hold.wait)  # the one pool thread is busy: the line waits
    await line.backlog.requeue("c1", "t2", 7)
    await line.backlog.requeue("c2", "u5", 9)
    line.backlog.detach()
    line.backlog.flush()
    await line.backlog.requeue("c3", "v1", 3)  # after the detach: the broker
    hold.set()
    line.settle()
    assert line.sent == [("c1", "t2", 7), ("c2", "u5", 9), ("c3", "v1", 3)]
    assert line.ran == []  # the pool's jobs found the line empty


@pytest.fixture
def one_slot(redis_url: str, tmp_path: Path) -> Iterator[WorkerPool]:
    agents = "tests.support.fair_agents"
    pool = WorkerPool(redis_url, tmp_path, concurrency=1, agents=agents)
    pool.start()
    yield pool
    pool.stop_all()


def test_a_waiting_conversation_runs_before_a_busy_one_finishes(
    one_slot: WorkerPool, redis_client: redis.Redis
) -> None:
    busy, other = f"busy-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"
    with one_slot.client() as client:
        queued = [client.submit(busy, f"turn {n}", agent="slow") for n in range(3)]
        waiting = client.submit(other, "me too", agent="slow")
        for handle in [*queued, waiting]:
            assert handle.wait(60).ok
    keys = KeySchema(one_slot.prefix)

    def started(handle: object) -> int:
        cid, tid = handle.conversation_id, handle.turn_id  # type: ignore[attr-defined]
        return int(redis_client.hget(keys.turn(cid, tid), "started_ms"))

    # One slot: without fairness the busy conversation would run all its turns first.
    assert started(queued[0]) < started(waiting) < started(queued[1])

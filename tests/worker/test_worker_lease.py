"""A turn's run and its lease, in this process against a real redis-server: the renewer
stops on the run's end even when a library swallows its cancellation, a cancel stops a
turn stuck in one model call, a turn past max_turn_s is failed, warm shutdown hands a
running turn back, and a journal write retries through a Redis restart.

Each run is awaited with a bound (``finishes``): on code that waits for a cancellation to
land, the bound runs out and the test fails instead of hanging."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from convoq import Agent, tool
from convoq.errors import NotInboxHeadError
from convoq.messages import Message, MessageRole, ToolCall
from convoq.models import ModelRequest, ScriptedModel
from convoq.redis import TurnProtocol
from convoq.redis.protocol import TurnEnding
from convoq.worker.profiles import Profiles
from convoq.worker.runner import DrainReport, Runner, RunnerConfig
from tests.support.redis_server import RedisServer

CID = "lease-1"
# Renewed every second: a loaded machine has 2 s of slack before a running turn's lease
# would lapse.
LEASE_MS = 3000
# The lease a paused worker outlives (it sleeps past it: time only ever runs longer).
PAUSED_LEASE_MS = 600
BOUND_S = 10.0  # far above what any of these runs needs; only a hang reaches it


class SwallowingProtocol(TurnProtocol):
    """A protocol whose renewal, once it got its answer, keeps sleeping through any
    cancellation (as redis-py's asyncio client does in some paths) while ``swallow``."""

    swallow = False
    renewals: list[float]
    answered = 0
    swallowed = 0

    async def renew(self, cid: str, **kwargs: Any) -> bool:
        loop = asyncio.get_running_loop()
        self.renewals.append(loop.time())
        cancel = await super().renew(cid, **kwargs)
        self.answered += 1
        while self.swallow:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                self.swallowed += 1
        return cancel


@pytest.fixture
async def proto(redis_url: str, key_prefix: str) -> AsyncIterator[SwallowingProtocol]:
    protocol = SwallowingProtocol.from_url(redis_url, prefix=key_prefix)
    protocol.renewals = []
    yield protocol
    protocol.swallow = False
    await protocol.close()


class Gate:
    """A model call that signals it started and returns only once released (an
    ``asyncio.Event`` on the test's loop; nothing of it blocks a thread)."""

    def __init__(self, *, ignore_cancel: bool = False) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.ignore_cancel = ignore_cancel
        self.calls = 0

    async def __call__(self, request: ModelRequest) -> str:
        self.calls += 1
        self.started.set()
        while not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                if not self.ignore_cancel:
                    raise
        return f"released {request.messages[-1].text}"


def make_runner(proto: TurnProtocol, *agents: Agent, **config: Any) -> Runner:
    echo = Agent(ScriptedModel(lambda r: f"seen {r.messages[-1].text}"), name="echo")
    settings: dict[str, Any] = {"worker_id": "w-lease", "lease_ms": LEASE_MS, **config}
    return Runner(proto, Profiles([echo, *agents]), RunnerConfig(**settings))


async def submit(proto: TurnProtocol, tid: str, agent: str) -> None:
    await proto.submit(CID, tid, agent=agent, message=Message.user(tid), options={})


async def finishes(coro: Any) -> DrainReport:
    """The drain's report; fails (never hangs) when it does not end within BOUND_S."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait([task], timeout=BOUND_S)
    if not done:
        task.cancel()
        pytest.fail(f"the drain did not end within {BOUND_S}s")
    return task.result()


async def test_a_renewal_that_swallows_its_cancellation_does_not_hold_the_run(
    proto: SwallowingProtocol,
) -> None:
    async def answer_while_renewing(request: ModelRequest) -> str:
        proto.swallow = True
        count = proto.answered
        while proto.answered == count:  # until a renewal is past Redis, swallowing
            await asyncio.sleep(0.01)
        return "answered"

    agent = Agent(ScriptedModel(answer_while_renewing), name="renewing")
    await submit(proto, "t1", "renewing")
    report = await finishes(make_runner(proto, agent).drain(CID))
    assert report.succeeded == ["t1"]
    ended = len(proto.renewals)
    await asyncio.sleep(3 * LEASE_MS / 3000)  # several renewal periods
    assert len(proto.renewals) == ended  # nothing renews the lease of a run that ended
    assert proto.swallowed >= 1  # the renewal in flight did swallow its cancellation
    assert not await proto.redis.exists(proto.keys.lease(CID))
    assert [m.text for m in await proto.history(CID)] == ["t1", "answered"]


@pytest.mark.parametrize("ignore_cancel", [False, True])
async def test_cancel_stops_a_turn_stuck_in_one_model_call(
    proto: SwallowingProtocol, ignore_cancel: bool
) -> None:
    gate = Gate(ignore_cancel=ignore_cancel)
    stuck = Agent(ScriptedModel(gate), name="stuck")
    await submit(proto, "t1", "stuck")
    await submit(proto, "t2", "echo")
    drain = asyncio.ensure_future(make_runner(proto, stuck).drain(CID))
    await gate.started.wait()
    assert await proto.cancel(CID, "t1") == "stopping"
    report = await finishes(drain)
    gate.release.set()  # lets a model call that ignored its cancellation end
    assert report.failed == ["t1"] and report.succeeded == ["t2"]
    assert (await proto.get_turn(CID, "t1")).status == "cancelled"
    assert [m.text for m in await proto.history(CID)] == ["t2", "seen t2"]


async def test_a_turn_past_max_turn_s_fails_and_the_conversation_moves_on(
    proto: SwallowingProtocol,
) -> None:
    gate = Gate(ignore_cancel=True)
    stuck = Agent(ScriptedModel(gate), name="stuck")
    await submit(proto, "t1", "stuck")
    await submit(proto, "t2", "echo")
    report = await finishes(make_runner(proto, stuck, max_turn_s=0.5).drain(CID))
    gate.release.set()
    assert report.failed == ["t1"] and report.succeeded == ["t2"]
    record = await proto.get_turn(CID, "t1")
    assert record.status == "failed"
    assert record.error is not None and record.error["type"] == "TurnDeadlineError"
    assert "max_turn_s" in record.error["message"]
    assert [m.text for m in await proto.history(CID)] == ["t2", "seen t2"]


async def test_warm_shutdown_hands_a_running_turn_back(proto: SwallowingProtocol) -> None:
    gate = Gate()
    stuck = Agent(ScriptedModel(gate), name="stuck")
    await submit(proto, "t1", "stuck")
    await submit(proto, "t2", "echo")
    leaving = make_runner(proto, stuck, shutdown_grace_s=0.3)
    drain = asyncio.ensure_future(leaving.drain(CID))
    await gate.started.wait()
    leaving.begin_shutdown()
    report = await finishes(drain)
    assert report.abandoned == ["t1"] and not report.succeeded and not report.failed
    assert not await proto.redis.exists(proto.keys.lease(CID))  # free for any worker now
    assert await proto.redis.hget(proto.keys.turn(CID, "t1"), "runs") == b"0"  # no attempt
    assert (await leaving.drain(CID)).idle  # a worker shutting down takes nothing new
    gate.release.set()
    other = make_runner(proto, stuck, worker_id="w-other")
    report = await finishes(other.drain(CID))
    assert report.succeeded == ["t1", "t2"]
    assert (await proto.get_turn(CID, "t1")).attempts == 2
    assert [m.text for m in await proto.history(CID)] == ["t1", "released t1", "t2", "seen t2"]


async def test_a_renewal_reports_a_cancel_and_extends_nothing_once_its_turn_ended(
    proto: SwallowingProtocol,
) -> None:
    await submit(proto, "t1", "echo")
    await submit(proto, "t2", "echo")
    acq = await proto.acquire(CID, worker_id="w-a", lease_ms=LEASE_MS)
    assert acq is not None and acq.turn.turn_id == "t1"
    assert await proto.renew(CID, fence=acq.fence, lease_ms=LEASE_MS, turn_id="t1") is False
    assert await proto.cancel(CID, "t1") == "stopping"
    assert await proto.renew(CID, fence=acq.fence, lease_ms=LEASE_MS, turn_id="t1") is True
    # t1 ends; the lease (same fence) goes on to t2. A renewal for t1 arriving now, late
    # from some library, must not extend the lease on t1's behalf.
    error = {"type": "TurnCancelledError", "message": "cancelled", "details": {}}
    await proto.fail(CID, "t1", error, TurnEnding(fence=acq.fence, lease_ms=60_000))
    with pytest.raises(NotInboxHeadError):
        await proto.renew(CID, fence=acq.fence, lease_ms=600_000, turn_id="t1")
    assert await proto.redis.pttl(proto.keys.lease(CID)) <= 60_000
    assert await proto.renew(CID, fence=acq.fence, lease_ms=LEASE_MS, turn_id="t2") is False


class PausedAfterJournal(TurnProtocol):
    """A worker paused (SIGSTOP, a stalled host) right after its first journal write came
    back: the whole event loop stands still for longer than the lease."""

    paused = False

    async def checkpoint(self, cid: str, turn_id: str, **kwargs: Any) -> bool:
        cancel = await super().checkpoint(cid, turn_id, **kwargs)
        if not self.paused:
            self.paused = True
            time.sleep(1.5 * PAUSED_LEASE_MS / 1000)  # blocks the loop: nothing renews
        return cancel


async def test_a_worker_woken_past_its_lease_starts_no_further_step(
    redis_url: str, key_prefix: str
) -> None:
    """Its lease lapsed while it stood still: it must not start the tool call it was
    about to make (the lease's next holder runs it); the tool runs once in all."""
    runs: list[str] = []

    @tool
    def side_effect(note: str) -> str:
        """Do something that must not happen twice."""
        runs.append(note)
        return "done"

    def model(request: ModelRequest) -> str | Message:
        if request.messages[-1].role == MessageRole.TOOL:
            return f"after {request.messages[-1].text}"
        call = ToolCall(id="c1", name="side_effect", arguments={"note": "once"})
        return Message(role=MessageRole.ASSISTANT, tool_calls=[call])

    agent = Agent(ScriptedModel(model), name="effect", tools=[side_effect])
    paused = PausedAfterJournal.from_url(redis_url, prefix=key_prefix)
    try:
        await submit(paused, "t1", "effect")
        report = await finishes(make_runner(paused, agent, lease_ms=PAUSED_LEASE_MS).drain(CID))
        assert report.abandoned == ["t1"] and runs == []
        while await paused.redis.exists(paused.keys.lease(CID)):
            await asyncio.sleep(0.05)  # until the stale lease is gone
        report = await finishes(make_runner(paused, agent, worker_id="w-next").drain(CID))
        assert report.succeeded == ["t1"] and runs == ["once"]
    finally:
        await paused.close()


# -- a journal write while Redis restarts ---------------------------------------------------


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


@pytest.mark.parametrize("outage", ["after the tool", "after the final answer"])
async def test_fenced_writes_are_retried_through_a_redis_restart(
    own_server: RedisServer, key_prefix: str, outage: str
) -> None:
    """Redis goes away right after the tool ran (its journal entry cannot be written), or
    right after the final answer (the commit cannot be sent). Each write is retried while
    the lease holds, so the turn completes in this run: the tool and the model ran once."""
    runs: list[str] = []
    model_calls: list[int] = []

    def redis_restarts() -> None:
        # Down for longer than redis-py's own retries last (5, backing off to 1 s).
        own_server.kill()
        threading.Timer(4.0, own_server.start).start()

    @tool
    def side_effect(note: str) -> str:
        """Do something that must not happen twice."""
        runs.append(note)
        if outage == "after the tool":
            redis_restarts()
        return "done"

    def model(request: ModelRequest) -> str | Message:
        model_calls.append(len(request.messages))
        if request.messages[-1].role == MessageRole.TOOL:
            if outage == "after the final answer":
                redis_restarts()
            return f"after {request.messages[-1].text}"
        call = ToolCall(id="c1", name="side_effect", arguments={"note": "once"})
        return Message(role=MessageRole.ASSISTANT, tool_calls=[call])

    agent = Agent(ScriptedModel(model), name="effect", tools=[side_effect])
    protocol = TurnProtocol.from_url(own_server.url, prefix=key_prefix)
    try:
        await submit(protocol, "t1", "effect")
        runner = make_runner(protocol, agent, lease_ms=20_000)
        report = await asyncio.wait_for(runner.drain(CID), 60)
        assert report.succeeded == ["t1"], report
        assert runs == ["once"] and len(model_calls) == 2
        assert [m.text for m in await protocol.history(CID)][-1] == "after done"
    finally:
        await protocol.close()


async def test_a_turn_renews_once_a_period_and_a_short_one_never(proto: SwallowingProtocol) -> None:
    # Renewed every LEASE_MS / 3 = 1 s, the first time one period into the run: a turn
    # ending sooner sends no renewal at all; one running 2.5 s sends two, a period apart.
    await submit(proto, "quick", "echo")
    assert (await finishes(make_runner(proto).drain(CID))).succeeded == ["quick"]
    assert proto.renewals == []

    async def two_and_a_half_seconds(request: ModelRequest) -> str:
        await asyncio.sleep(2.5)
        return "slow"

    slow = Agent(ScriptedModel(two_and_a_half_seconds), name="slow")
    await submit(proto, "slow", "slow")
    started = asyncio.get_running_loop().time()
    assert (await finishes(make_runner(proto, slow).drain(CID))).succeeded == ["slow"]
    assert len(proto.renewals) == 2
    first, second = (t - started for t in proto.renewals)
    assert 0.9 <= first < 2.0 and 0.9 <= second - first < 2.0

"""The runner and the sweeper in this process, against a real redis-server: turns that a
script fails before they run (over max attempts) and turns whose approval expired are
finished like any other, so the after-turn hook (which sends callbacks) sees each of them
once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from convoq import Agent
from convoq.messages import Message, ToolCall
from convoq.models import ScriptedModel
from convoq.redis import TurnProtocol
from convoq.turn_state import TurnState
from convoq.worker.profiles import Profiles
from convoq.worker.runner import Runner, RunnerConfig
from convoq.worker.sweeper import Sweeper

CID = "conv-1"
HOOK = {"callback_url": "https://example.test/hook"}


class Finished:
    """An after-turn hook that records what it was called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    async def __call__(self, cid: str, tid: str, options: dict[str, Any]) -> None:
        self.calls.append((cid, tid, options))


def runner(proto: TurnProtocol, hook: Finished, max_attempts: int = 5) -> Runner:
    echo = Agent(ScriptedModel(lambda request: f"seen {request.messages[-1].text}"), name="echo")
    config = RunnerConfig(worker_id="w-test", lease_ms=5_000, max_attempts=max_attempts)
    return Runner(proto, Profiles([echo]), config, on_finished=hook)


async def submit(proto: TurnProtocol, tid: str, options: dict[str, Any]) -> None:
    message = Message.user(f"text of {tid}")
    await proto.submit(CID, tid, agent="echo", message=message, options=options)


async def expire_lease(proto: TurnProtocol) -> None:
    """End the lease as its lifetime would: the lease is a key with a PX expiry, so its
    expiry is the key going (done here, not raced against a short lifetime)."""
    assert await proto.redis.delete(proto.keys.lease(CID)) == 1


async def park_until_expired(proto: TurnProtocol, tid: str) -> None:
    """Run ``tid`` to a tool call awaiting approval that nobody answers in time."""
    acquired = await proto.acquire(CID, worker_id="w-old", lease_ms=5_000)
    assert acquired is not None and acquired.turn.turn_id == tid
    call = ToolCall(id="c1", name="transfer")
    state = TurnState(
        messages=[acquired.turn.input, Message.assistant("", tool_calls=[call])],
        steps=1,
        pending=[call],
    )
    await proto.park(CID, tid, fence=acquired.fence, state=state, approval_ttl_ms=600_000)
    await expire_lease(proto)


async def last_event(proto: TurnProtocol, tid: str) -> tuple[str, Any]:
    events = await proto.read_events(CID, tid)
    return events[-1][1].type, events[-1][1].data


async def test_an_expired_approval_ends_the_turn_as_expired_stored_and_announced(
    proto: TurnProtocol,
) -> None:
    hook = Finished()
    await submit(proto, "t1", HOOK)
    await submit(proto, "t2", {})
    await park_until_expired(proto, "t1")

    report = await runner(proto, hook).drain(CID)

    assert report.expired == ["t1"] and report.succeeded == ["t2"] and not report.failed
    assert hook.calls == [(CID, "t1", HOOK), (CID, "t2", {})]
    record = await proto.get_turn(CID, "t1")
    assert record.status == "expired" and record.error is None
    assert record.decisions["c1"].expired and record.decisions["c1"].at_ms
    assert record.result is not None and record.result["text"] == ""
    events = [e for _, e in await proto.read_events(CID, "t1")]
    assert [e.data["call_id"] for e in events if e.type == "decision"] == ["c1"]
    assert await last_event(proto, "t1") == ("done", {"status": "expired"})
    # Stored: the model of the next turn reads that the call did not run, and why.
    history = await proto.history(CID)
    assert [m.role for m in history[:3]] == ["user", "assistant", "tool"]
    assert "approval expired" in history[2].text and "did not run" in history[2].text
    assert history[2].decision is not None and history[2].decision.expired
    assert history[3].text == "text of t2"
    again = await runner(proto, hook).drain(CID)
    assert again.idle and len(hook.calls) == 2  # never again


async def test_turn_over_max_attempts_failed_by_acquire_gets_the_finished_hook(
    proto: TurnProtocol,
) -> None:
    hook = Finished()
    await submit(proto, "t1", HOOK)
    # A first run whose worker died: its lease expires with the turn still running.
    assert await proto.acquire(CID, worker_id="w-dead", lease_ms=600_000) is not None
    await expire_lease(proto)

    report = await runner(proto, hook, max_attempts=1).drain(CID)

    assert report.failed == ["t1"] and report.succeeded == []
    assert hook.calls == [(CID, "t1", HOOK)]
    record = await proto.get_turn(CID, "t1")
    assert record.error is not None and record.error["type"] == "MaxAttemptsExceededError"
    assert await last_event(proto, "t1") == ("done", {"status": "failed"})


async def test_sweeper_kicks_a_conversation_whose_approval_expired(
    proto: TurnProtocol,
) -> None:
    hook, kicked = Finished(), []

    async def kick(cid: str) -> None:
        kicked.append(cid)

    await submit(proto, "t1", HOOK)
    sweeper = Sweeper(proto, kick, interval_s=1.0)
    await park_until_expired(proto, "t1")

    assert await sweeper.sweep_once() == kicked == [CID]
    assert (await runner(proto, hook).drain(CID)).expired == ["t1"]
    assert hook.calls == [(CID, "t1", HOOK)]
    assert await sweeper.sweep_once() == []  # ended: nothing left to kick


class ResentCommit:
    """Runs the commit script twice and answers with the second reply, as redis-py does
    when the reply to an EVALSHA is lost to a socket timeout and it sends it again."""

    def __init__(self, proto: TurnProtocol) -> None:
        self._run = proto.scripts.run

    async def __call__(self, name: str, keys: list[str], args: list[Any]) -> list[Any]:
        if name == "commit":
            await self._run(name, keys, args)
        return await self._run(name, keys, args)


async def test_a_resent_commit_still_gets_the_finished_hook(
    proto: TurnProtocol, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = Finished()
    await submit(proto, "t1", HOOK)
    monkeypatch.setattr(proto.scripts, "run", ResentCommit(proto))

    report = await runner(proto, hook).drain(CID)

    assert report.succeeded == ["t1"]
    assert hook.calls == [(CID, "t1", HOOK)]  # the callback is owed all the same
    assert len(await proto.history(CID)) == 2  # and the turn was stored once
    assert (await proto.get_turn(CID, "t1")).status == "succeeded"


async def test_sweeper_skips_an_inbox_entry_that_is_no_turn_id(
    proto: TurnProtocol, key_prefix: str
) -> None:
    kicked: list[str] = []

    async def kick(cid: str) -> None:
        kicked.append(cid)

    await proto.redis.rpush(proto.keys.inbox("broken"), b"not a turn id!")
    await submit(proto, "t1", {})  # queued, no lease: stranded
    sweeper = Sweeper(proto, kick, interval_s=1.0)

    assert await sweeper.sweep_once() == kicked == [CID]


class LeaseStolenBeforePark(TurnProtocol):
    """Another worker takes the conversation over just before this one parks its turn
    (the lease lapsed after the last checkpoint): a real script call, a real refusal."""

    async def park(self, cid: str, turn_id: str, **kwargs: Any) -> None:
        await self.redis.hset(self.keys.lease(cid), "fence", "999999999999999999")
        await super().park(cid, turn_id, **kwargs)


async def test_a_park_refused_for_a_stolen_lease_abandons_the_turn(
    redis_url: str, key_prefix: str
) -> None:
    from convoq import tool

    @tool(requires_approval=True)
    def transfer() -> str:
        return "sent"

    def ask(request: Any) -> Message:
        return Message.assistant("", tool_calls=[ToolCall(id="c1", name="transfer")])

    proto = LeaseStolenBeforePark.from_url(redis_url, prefix=key_prefix)
    try:
        agent = Agent(ScriptedModel(ask), name="echo", tools=[transfer])
        config = RunnerConfig(worker_id="w-test", lease_ms=5_000)
        hook = Finished()
        await submit(proto, "t-stolen", {})
        report = await Runner(proto, Profiles([agent]), config, on_finished=hook).drain(CID)
        assert report.abandoned == ["t-stolen"] and report.parked == []
        record = await proto.get_turn(CID, "t-stolen")
        assert record.status == "running" and hook.calls == []
    finally:
        await proto.close()


class RedisGoneAfterCommit(TurnProtocol):
    """Redis becomes unreachable right after a commit, before the next turn is taken."""

    async def _take(self, cid: str, head: Any, t: Any) -> Any:
        if getattr(self, "committed", False):
            raise RedisConnectionError("Connection closed by server.")
        return await super()._take(cid, head, t)

    async def commit_and_hand_off(self, cid: str, turn_id: str, *args: Any, **kwargs: Any) -> Any:
        self.committed = True
        return await super().commit_and_hand_off(cid, turn_id, *args, **kwargs)


async def test_a_stored_turn_keeps_its_callback_when_redis_goes_away_before_the_next(
    redis_url: str, key_prefix: str
) -> None:
    proto = RedisGoneAfterCommit.from_url(redis_url, prefix=key_prefix)
    loop = asyncio.get_running_loop()

    def answer_while_t2_arrives(request: Any) -> str:
        # t-2 arrives while t-1 runs: the commit names it and a second call must take it.
        asyncio.run_coroutine_threadsafe(submit(proto, "t-2", HOOK), loop).result()
        return "done"

    try:
        hook = Finished()
        await submit(proto, "t-1", HOOK)
        agent = Agent(ScriptedModel(answer_while_t2_arrives), name="echo")
        config = RunnerConfig(worker_id="w-test", lease_ms=5_000)
        report = await Runner(proto, Profiles([agent]), config, on_finished=hook).drain(CID)
        assert report.succeeded == ["t-1"]
        assert [tid for _, tid, _ in hook.calls] == ["t-1"]
        assert (await proto.get_turn(CID, "t-1")).status == "succeeded"
        assert (await proto.get_turn(CID, "t-2")).status == "queued"
    finally:
        await proto.close()


async def test_a_negative_history_window_is_a_convoq_error(proto: TurnProtocol) -> None:
    from convoq.errors import ConvoqError

    with pytest.raises(ConvoqError, match="last_turns must be >= 0"):
        await proto.history(CID, last_turns=-1)

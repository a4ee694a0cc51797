"""One writer per conversation across processes, whichever API writes it: a real worker
process and an in-process Agent on RedisConversationMemory share the conversation's lease,
so neither's turn runs while the other's does, and nothing interleaves."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from convoq import Agent, Message, ToolCall, tool
from convoq.client import Client
from convoq.errors import ConversationBusyError
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel
from tests.support.workers import WorkerPool, module_pool, wait_until

pytestmark = pytest.mark.slow

pool = module_pool(1)


@pytest.fixture
def memory(pool: WorkerPool) -> Iterator[RedisConversationMemory]:
    mem = RedisConversationMemory(pool.redis_url, prefix=pool.prefix)
    yield mem
    mem.close()


def _tkey(pool: WorkerPool, *parts: str) -> str:
    return ":".join([pool.prefix, "test", *parts])


def _echo(request: ModelRequest) -> str:
    return f"agent saw {len(request.messages)} messages"


def test_an_agent_is_refused_while_a_worker_runs_the_conversation_then_waits_its_turn(
    client: Client, pool: WorkerPool, r: redis.Redis, memory: RedisConversationMemory
) -> None:
    cid, word = f"c-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:8]
    running = client.submit(cid, f"{word} slow", agent="blocker")
    wait_until(lambda: r.llen(_tkey(pool, "ran", word)) == 1, 30, what="the worker runs it")

    refused = Agent(ScriptedModel(_echo), memory=memory, conversation_id=cid)
    with pytest.raises(ConversationBusyError):
        refused.generate("refused")
    assert memory.load(cid) == []  # nothing of the refused turn, nothing before the worker's

    waiting = Agent(
        ScriptedModel(_echo), memory=memory, conversation_id=cid, if_busy="wait", busy_timeout_s=60
    )
    answers: list[str] = []
    thread = threading.Thread(target=lambda: answers.append(waiting.generate("after").text))
    thread.start()
    r.set(_tkey(pool, "release", word), 1)
    assert running.wait(30).ok
    thread.join(60)
    # The agent ran after the worker's turn was stored, and saw it.
    assert answers == ["agent saw 3 messages"]
    texts = [m.text for m in memory.load(cid)]
    assert texts == [f"{word} slow", f"released {word} slow", "after", "agent saw 3 messages"]


def test_a_worker_turn_waits_while_an_agent_holds_the_conversation(
    client: Client, r: redis.Redis, memory: RedisConversationMemory
) -> None:
    cid = f"c-{uuid.uuid4().hex[:8]}"
    go = threading.Event()

    def slow(request: ModelRequest) -> str:
        go.wait(60)  # runs in a thread: the agent's lease keeps being renewed meanwhile
        return "agent answer"

    agent = Agent(ScriptedModel(slow), memory=memory, conversation_id=cid)
    answers: list[str] = []
    thread = threading.Thread(target=lambda: answers.append(agent.generate("agent first").text))
    thread.start()
    lease = memory._keys.lease(cid)
    wait_until(lambda: r.hget(lease, "holder"), 30, what="the agent takes the lease")
    with pytest.raises(ConversationBusyError):  # nothing queued, but the agent's turn runs
        client.submit(cid, "rejected", agent="echo", if_busy="reject")
    queued = client.submit(cid, "worker second", agent="echo")
    # The kick finds the agent's lease: the worker runs nothing until the agent is done.
    wait_until(lambda: queued.status() == "queued", 30)
    assert memory.load(cid) == []
    assert queued.status() == "queued"
    go.set()
    thread.join(60)
    assert answers == ["agent answer"]
    # The sweeper kicks the conversation once the agent's commit freed the lease.
    assert queued.wait(30).text == "seen: agent first | worker second"
    texts = [m.text for m in memory.load(cid)]
    assert texts == ["agent first", "agent answer", "worker second", texts[3]]


def test_a_worker_turn_waits_behind_an_agent_turn_awaiting_approval_and_its_resume(
    client: Client, r: redis.Redis, memory: RedisConversationMemory, pool: WorkerPool
) -> None:
    cid = f"c-{uuid.uuid4().hex[:8]}"
    ran: list[int] = []

    @tool(requires_approval=True)
    def pay(amount: int) -> str:
        """Pay (once)."""
        ran.append(amount)
        return f"paid {amount}"

    def payer(request: ModelRequest) -> str | Message:
        last = request.messages[-1]
        if last.role == MessageRole.TOOL:
            return f"done: {last.text}"
        call = ToolCall(id="p1", name="pay", arguments={"amount": 3})
        return Message(role="assistant", tool_calls=[call])

    agent = Agent(ScriptedModel(payer), memory=memory, conversation_id=cid, tools=[pay])
    wire = agent.generate("pay 3").continuation.model_dump_json()  # type: ignore[union-attr]
    assert r.hget(memory._keys.lease(cid), "state") == b"parked"
    queued = client.submit(cid, "worker after", agent="echo")
    wait_until(lambda: queued.status() == "queued", 30)
    # Resumed through another memory object (as another process would): the same lease.
    other = RedisConversationMemory(pool.redis_url, prefix=pool.prefix)
    try:
        resumer = Agent(ScriptedModel(payer), memory=other, conversation_id=cid, tools=[pay])
        assert resumer.resume(wire, {"p1": True}).text == "done: paid 3"
    finally:
        other.close()
    assert queued.wait(30).text == "seen: pay 3 | worker after"
    assert ran == [3]
    texts = [m.text for m in memory.load(cid) if m.role == MessageRole.USER]
    assert texts == ["pay 3", "worker after"]


def test_an_agent_turn_longer_than_its_lease_keeps_it_and_is_stored(
    redis_url: str, key_prefix: str, r: redis.Redis
) -> None:
    # Renewed every second: a busy machine has 2 s of slack before the lease would lapse.
    memory = RedisConversationMemory(redis_url, prefix=key_prefix, lease_ms=3000)
    lease = memory._keys.lease("long")
    held: list[bool] = []
    expiries: list[int] = []

    def slow(_: ModelRequest) -> str:
        # Until Redis's clock is past the expiry the lease had when the call began: only
        # renewals keep the lease, and so the commit, ours.
        first = int(r.hget(lease, "expires_ms") or 0)
        deadline = time.monotonic() + 60  # bounded; renewals come every second
        while time.monotonic() < deadline:
            seconds, micros = r.time()
            if seconds * 1000 + micros // 1000 > first:
                break
            held.append(bool(r.exists(lease)))
            expiries.append(int(r.hget(lease, "expires_ms") or 0))
            time.sleep(0.1)
        held.append(bool(r.exists(lease)))
        expiries.append(int(r.hget(lease, "expires_ms") or 0))
        return "late answer"

    try:
        agent = Agent(ScriptedModel(slow), memory=memory, conversation_id="long")
        assert agent.generate("take your time").text == "late answer"
        assert all(held) and expiries == sorted(expiries)
        assert expiries[-1] > expiries[0]  # renewed: the call outlived the lease it began with
        assert [m.text for m in memory.load("long")] == ["take your time", "late answer"]
        assert not r.exists(lease)  # the commit freed it
    finally:
        memory.close()

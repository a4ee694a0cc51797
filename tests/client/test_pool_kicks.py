"""The queue each of the client's control kicks goes to, on a real Redis (the broker too)
with no worker running: with ``CONVOQ_AGENT_POOLS`` the kick after an approval, a denial,
a deferred call's result, a signal, a retry goes to the pool serving the agent the turn's
record names (the target, after a handoff); the drain after a cancel or a discard to the
pool of the turn now first in line; without pools every kick goes to the default queues,
and the client reads no agent. The gateway's decisions and cancels kick as its client
does."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
import redis

from convoq.client import AsyncClient
from convoq.gateway import create_app
from convoq.messages import Message
from convoq.queue.routing import DRAIN_TASK, RESUME_TASK, partition_of, queue_name
from convoq.redis import TurnEnding
from convoq.settings import ConvoqSettings, GatewayKey
from convoq.turn_state import TurnState, Wait
from tests.support.gateway import turns_path
from tests.support.protocol_helpers import park_head

POOLS = {"courier": "vip", "echo": "side"}
QUEUES: tuple[str | None, ...] = (None, "vip", "side")  # None: the default queues
RESULT = Wait(on="result")
PAID = Wait(on="signal", name="paid")


@pytest.fixture(params=[True, False], ids=["pools", "no-pools"])
async def client(
    request: pytest.FixtureRequest, redis_url: str, key_prefix: str
) -> AsyncIterator[AsyncClient]:
    pools = POOLS if request.param else {}
    settings = ConvoqSettings.resolve(
        redis_url=redis_url, prefix=key_prefix, partitions=4, agent_pools=pools
    )
    async with AsyncClient(settings=settings) as c:
        yield c


def _kicks(r: redis.Redis, client: AsyncClient, cid: str) -> dict[str | None, list[str]]:
    """The tasks waiting on each queue of the conversation (kombu keeps a queue as a list),
    taken off (conversations of one test may share a partition)."""
    n = partition_of(cid, client.partitions)
    found: dict[str | None, list[str]] = {}
    for pool in QUEUES:
        queue = queue_name(client.prefix, n, pool)
        found[pool] = [json.loads(m)["headers"]["task"] for m in r.lrange(queue, 0, -1)]
        r.delete(queue)
    return found


def _only(client: AsyncClient, pool: str, *tasks: str) -> dict[str | None, list[str]]:
    """What the queues hold when ``tasks`` went to ``pool``'s (the default's without pools)."""
    where = pool if client.settings.agent_pools else None
    return {p: list(tasks) if p == where else [] for p in QUEUES}


async def _submit(proto: Any, cid: str, tid: str, agent: str) -> None:
    await proto.submit(cid, tid, agent=agent, message=Message.user(tid), options={})


@pytest.fixture
def reads(client: AsyncClient, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The turns whose agent the client read apart (the protocol's own method, counted)."""
    seen: list[str] = []
    proto: Any = client.protocol
    read: Callable[[str, str], Awaitable[str | None]] = proto.turn_agent

    async def counted(cid: str, tid: str) -> str | None:
        seen.append(tid)
        return await read(cid, tid)

    monkeypatch.setattr(proto, "turn_agent", counted)
    return seen


async def test_a_resume_goes_to_the_pool_of_the_turns_agent(
    client: AsyncClient, redis_client: redis.Redis, reads: list[str]
) -> None:
    proto: Any = client.protocol
    for cid, approved in (("approved", True), ("denied", False)):
        await _submit(proto, cid, "t1", "courier")
        await park_head(proto, cid, a=None)
        handle = client.handle(cid, "t1")
        if approved:
            assert await client.approve(handle, "a") == "resume"
        else:
            assert await client.deny(handle, "a", reason="no") == "resume"
        assert _kicks(redis_client, client, cid) == _only(client, "vip", RESUME_TASK)
    # Handed to courier before it parked: its record names courier, the kick follows.
    await _submit(proto, "handed", "t1", "triage")
    await park_head(proto, "handed", hand_to="courier", a=None)
    await client.approve(client.handle("handed", "t1"), "a")
    assert _kicks(redis_client, client, "handed") == _only(client, "vip", RESUME_TASK)
    assert reads == []  # the decide script answered the agent


async def test_a_result_and_a_signal_resume_on_the_pool_of_the_turns_agent(
    client: AsyncClient, redis_client: redis.Redis, reads: list[str]
) -> None:
    proto: Any = client.protocol
    await _submit(proto, "result", "t1", "courier")
    await park_head(proto, "result", job=RESULT)
    assert await client.complete_call(client.handle("result", "t1"), "job", "ok") == "resume"
    assert _kicks(redis_client, client, "result") == _only(client, "vip", RESUME_TASK)
    await _submit(proto, "signal", "t1", "courier")
    await park_head(proto, "signal", pay=PAID)
    sent = await client.signal("signal", "paid", 1, signal_id="evt")
    assert (sent.outcome, sent.resume) == ("delivered", True)
    assert _kicks(redis_client, client, "signal") == _only(client, "vip", RESUME_TASK)
    # The same signal again (its first answer lost): a drain for the head, on its pool.
    assert (await client.signal("signal", "paid", 1, signal_id="evt")).outcome == "duplicate"
    assert _kicks(redis_client, client, "signal") == _only(client, "vip", DRAIN_TASK)
    assert reads == []


async def test_a_retry_goes_to_the_pool_of_the_turns_agent(
    client: AsyncClient, redis_client: redis.Redis, reads: list[str]
) -> None:
    proto: Any = client.protocol
    await _submit(proto, "retry", "t1", "triage")
    taken = await proto.acquire("retry", worker_id="w1", lease_ms=30_000)
    assert taken is not None
    state = TurnState(messages=[taken.turn.input])
    await proto.transfer("retry", "t1", fence=taken.fence, state=state, agent="courier",
                         release=False)  # fmt: skip
    error = {"type": "ModelError", "message": "no", "details": {}}
    await proto.fail("retry", "t1", error, TurnEnding(fence=taken.fence))
    await client.retry(client.handle("retry", "t1"))
    assert _kicks(redis_client, client, "retry") == _only(client, "vip", DRAIN_TASK)
    assert reads == []


async def test_a_cancel_and_a_discard_wake_the_next_turn_on_its_pool(
    client: AsyncClient, redis_client: redis.Redis, reads: list[str]
) -> None:
    proto: Any = client.protocol
    for cid in ("cancel", "discard"):
        await _submit(proto, cid, "t1", "courier")
        await park_head(proto, cid, a=None)
        await _submit(proto, cid, "t2", "echo")  # another agent, another pool
        if cid == "cancel":
            assert await client.cancel(client.handle(cid, "t1")) == "cancelled"
        else:
            await client.discard(client.handle(cid, "t1"))
        assert _kicks(redis_client, client, cid) == _only(client, "side", DRAIN_TASK)
    # The next turn's agent is one read, made only when pools are named.
    assert reads == (["t2", "t2"] if client.settings.agent_pools else [])
    # Cancelled with no turn behind it: nothing to wake, no kick.
    await _submit(proto, "alone", "t1", "courier")
    assert await client.cancel(client.handle("alone", "t1")) == "cancelled"
    assert _kicks(redis_client, client, "alone") == {p: [] for p in QUEUES}


async def test_the_gateways_decisions_and_cancels_kick_the_pools(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    """The gateway acts through its client, made with the gateway's settings."""
    key = "key-for-the-pool-kicks-test"
    app = create_app(
        redis_url=redis_url, prefix=key_prefix, partitions=4, agent_pools=POOLS,
        gateway_api_keys=[GatewayKey(key=key, scopes=("admin",))],
    )  # fmt: skip
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://gw", headers=headers) as http,
    ):
        client: AsyncClient = app.state.client
        proto: Any = client.protocol
        await _submit(proto, "gw", "t1", "courier")
        await park_head(proto, "gw", a=None)
        await _submit(proto, "gw", "t2", "echo")
        decided = await http.post(f"{turns_path('gw')}/t1/approvals/a", json={"decision": "deny"})
        assert decided.status_code == 200 and decided.json()["outcome"] == "resume"
        assert _kicks(redis_client, client, "gw") == _only(client, "vip", RESUME_TASK)
        await proto.acquire("gw", worker_id="w1", lease_ms=30_000)  # t1 runs on
        await _submit(proto, "gw", "t3", "courier")
        cancelled = await http.post(f"{turns_path('gw')}/t2/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["outcome"] == "cancelled"
        # t1 is still first in line (running): the drain goes to its pool.
        assert _kicks(redis_client, client, "gw") == _only(client, "vip", DRAIN_TASK)

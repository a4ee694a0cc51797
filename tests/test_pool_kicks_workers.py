"""The client's control kicks on real workers when only pools serve the agents
(``CONVOQ_AGENT_POOLS``; no worker on the default queues, and a sweep interval of an hour,
so no sweep rescues a turn whose kick went astray): a turn parked for approval goes on
after an approval or a denial, a deferred call's result and a signal resume their turns,
a failed turn retried runs again, and after a cancel or a discard of a pooled agent's
turn (parked, queued, or running) the next queued turn, of another pool, runs. A
worker's own messages stay with the pools too: a conversation sent back in line when its
worker gives the slot up, and a webhook's delivery."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import redis

from convoq.client import Client
from convoq.errors import ModelError
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool, WorkerProcess, wait_until, webhook_receiver

AGENTS = "tests.support.worker_agents,tests.support.world_agents"
POOLS = json.dumps(
    {
        "approver": "vip",
        "courier": "vip",
        "blocker": "vip",
        "failer": "vip",
        "tracker": "vip",
        "echo": "side",
    }
)
WAIT_S = 60  # far below the sweep interval: a turn that goes on was kicked on its pool


@pytest.fixture(scope="module")
def pools(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerPool]:
    """One worker of the pool "vip" (approver, courier, blocker, failer), one of "side"
    (echo); none consumes the default queues, and neither sweeps within the tests."""
    pool = WorkerPool(
        redis_server.url, tmp_path_factory.mktemp("pool-kicks"), agents=AGENTS,
        agent_pools=POOLS, sweep_interval_s=3600, concurrency=4,
    )  # fmt: skip
    try:
        for name in ("vip", "side"):
            pool.workers.append(WorkerProcess({**pool.env, "CONVOQ_POOL": name}, pool.log_dir))
        for worker in pool.workers:
            worker.start()
        for worker in pool.workers:
            worker.wait_ready()
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture
def client(pools: WorkerPool, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    monkeypatch.setenv("CONVOQ_AGENT_POOLS", POOLS)  # the client knows the pools too
    with pools.client() as c:
        yield c


def _cid() -> str:
    return f"k-{uuid.uuid4().hex[:8]}"


def _status(client: Client, cid: str, tid: str, status: str) -> None:
    handle = client.handle(cid, tid)
    wait_until(lambda: handle.status() == status, WAIT_S, what=f"{cid}/{tid} {status}")


@pytest.mark.parametrize("approved", [True, False], ids=["approve", "deny"])
def test_a_parked_turn_goes_on_after_the_decision(client: Client, approved: bool) -> None:
    handle = client.submit(_cid(), "pay", agent="approver")
    parked = handle.wait(WAIT_S)
    assert parked.status == "awaiting_approval"
    call = parked.pending_approvals[0].id
    if approved:
        assert client.approve(handle, call) == "resume"
    else:
        assert client.deny(handle, call, reason="not today") == "resume"
    result = handle.wait(WAIT_S)
    assert result.status == "succeeded" and result.text.startswith("after tool: ")
    assert ("transferred 5" in result.text) is approved


def test_a_result_and_a_signal_resume_their_turns(client: Client) -> None:
    order = f"o{uuid.uuid4().hex[:8]}"
    shipped = client.submit(_cid(), f"ship {order}", agent="courier")
    _status(client, shipped.conversation_id, shipped.turn_id, "waiting")
    assert client.complete_call(shipped, f"ship-{order}", "left the depot") == "resume"
    assert shipped.wait(WAIT_S).text == "done: left the depot"
    cid = _cid()
    paid = client.submit(cid, f"pay {order}", agent="courier")
    _status(client, cid, paid.turn_id, "waiting")
    assert client.signal(cid, "paid", {"amount": 12}).resume
    assert paid.wait(WAIT_S).text == 'done: {"amount":12}'


def test_a_retried_turn_runs_again(client: Client) -> None:
    failed = client.submit(_cid(), "boom", agent="failer")
    with pytest.raises(ModelError):
        failed.wait(WAIT_S)
    failed.retry()
    again = failed.wait(WAIT_S, raise_on_error=False)
    assert (again.status, again.attempts) == ("failed", 2)  # the second run ended too


@pytest.mark.parametrize("end", ["cancel", "discard"])
def test_after_a_parked_turn_ends_the_next_turn_runs_on_its_pool(client: Client, end: str) -> None:
    cid = _cid()
    parked = client.submit(cid, "pay", agent="approver")
    assert parked.wait(WAIT_S).status == "awaiting_approval"
    queued = client.submit(cid, "never", agent="echo")
    after = client.submit(cid, "after", agent="echo")
    assert client.cancel(queued) == "cancelled"  # a queued turn behind the head
    if end == "cancel":
        assert client.cancel(parked) == "cancelled"
    else:
        client.discard(parked)
    result = after.wait(WAIT_S)
    assert result.status == "succeeded" and result.text == "seen: after"
    assert (parked.status(), queued.status()) == ("cancelled", "cancelled")


def test_after_a_running_turn_is_cancelled_the_next_turn_runs(
    client: Client, pools: WorkerPool, redis_client: redis.Redis
) -> None:
    cid, word = _cid(), uuid.uuid4().hex[:8]
    running = client.submit(cid, f"{word} hold", agent="blocker")
    ran = f"{pools.prefix}:test:ran:{word}"
    try:
        wait_until(lambda: redis_client.llen(ran), WAIT_S, what="the blocker's model call")
        after = client.submit(cid, "after", agent="echo")
        assert client.cancel(running) == "stopping"
        result = after.wait(WAIT_S)
        assert result.status == "succeeded" and result.text == "seen: after"
        assert running.status() == "cancelled"
    finally:
        redis_client.set(f"{pools.prefix}:test:release:{word}", 1)  # its model call returns


@pytest.mark.parametrize("fast_paths", ["on", "off"])
def test_a_pool_worker_that_gives_its_slot_up_sends_the_conversation_back_to_its_pool(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch, fast_paths: str,
) -> None:  # fmt: skip
    """One slot, two conversations of a pooled agent queued at once: after each turn the
    worker gives its slot up to the other conversation (with the fast paths off through
    the broker, kept lease and all). That message goes to the pool's queue, which this
    worker consumes: on the default queues nobody would take it, and no sweep comes."""
    pool = WorkerPool(
        redis_server.url, tmp_path_factory.mktemp("pool-requeue"), agents=AGENTS,
        agent_pools=POOLS, sweep_interval_s=3600, concurrency=1, fast_paths=fast_paths,
    )  # fmt: skip
    pool.workers.append(WorkerProcess({**pool.env, "CONVOQ_POOL": "vip"}, pool.log_dir))
    try:
        pool.workers[0].start().wait_ready()
        monkeypatch.setenv("CONVOQ_AGENT_POOLS", POOLS)
        with pool.client() as client:
            cids = [_cid(), _cid()]
            handles = [client.submit(cid, f"{cid} t{n}", agent="tracker") for n in range(3)
                       for cid in cids]  # fmt: skip
            assert [h.wait(WAIT_S).status for h in handles] == ["succeeded"] * len(handles)
        if fast_paths == "off":  # the slot was given up through the broker
            assert "go back through the broker (fast paths off)" in pool.logs()
    finally:
        pool.stop_all()


def test_a_pooled_turns_webhook_is_delivered_by_its_pool(client: Client) -> None:
    """The delivery of a finished turn's callback is a task too: sent on the finishing
    worker's own pool's queue, it is delivered where no worker reads the default queues."""
    with webhook_receiver() as hooks:
        handle = client.submit(_cid(), "hello", agent="echo", callback_url=f"{hooks.url}/done")
        assert handle.wait(WAIT_S).status == "succeeded"
        wait_until(lambda: hooks.posts("/done"), WAIT_S, what="the callback")
        (_, status, _, body) = hooks.posts("/done")[0]
    assert status == 200 and json.loads(body)["status"] == "succeeded"

"""Crashes: a worker killed mid-turn, a turn that kills every worker, an approval nobody
answers. Real worker processes, kill -9, short leases and sweeps."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import redis

from convoq.client import SIGNATURE_HEADER, verify_signature
from convoq.errors import TurnFailedError, TurnTimeoutError
from convoq.messages import MessageRole
from convoq.redis.keys import KeySchema
from tests.support.redis_server import RedisServer
from tests.support.workers import WEBHOOK_SECRET, WorkerPool, wait_until, webhook_receiver

pytestmark = pytest.mark.slow


@pytest.fixture
def make_pool(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[type[WorkerPool]]:
    pools: list[WorkerPool] = []

    def make(**settings: object) -> WorkerPool:
        pool = WorkerPool(redis_server.url, tmp_path_factory.mktemp("crash"), **settings)
        pools.append(pool)
        return pool

    yield make  # type: ignore[misc]
    for pool in pools:
        for worker in pool.workers:
            worker.kill()


def _tkey(pool: WorkerPool, *parts: str) -> str:
    return ":".join([pool.prefix, "test", *parts])


def test_killed_worker_turn_completes_on_another_once(make_pool, r: redis.Redis) -> None:  # type: ignore[no-untyped-def]
    pool: WorkerPool = make_pool(lease_ms=5000, sweep_interval_s=2.0)
    [first] = pool.start(1)
    cid, word = f"crash-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:8]
    with pool.client() as client:
        turn = client.submit(cid, f"{word} survive", agent="blocker")
        wait_until(lambda: r.llen(_tkey(pool, "ran", word)) == 1, 30, what="the model call")
        later = client.submit(cid, f"{word} later", agent="echo")
        first.kill()
        killed_at = time.monotonic()
        r.set(_tkey(pool, "release", word), 1)  # the rerun's model call returns at once
        pool.start(1)
        result = turn.wait(60)
        recovery_s = time.monotonic() - killed_at
        print(f"\nkill -9 -> turn completed on a new worker: {recovery_s:.1f}s")
        assert result.text == f"released {word} survive"
        assert result.attempts == 2
        runs = [x.decode() for x in r.lrange(_tkey(pool, "ran", word), 0, -1)]
        assert len(runs) == 2 and runs[0].split("@")[1] != runs[1].split("@")[1]
        assert later.wait(30).text == f"seen: {word} survive | {word} later"
        users = [m.text for m in client.history(cid) if m.role == MessageRole.USER]
        assert users == [f"{word} survive", f"{word} later"]  # stored exactly once
        assert not r.exists(KeySchema(pool.prefix).lease(cid))
        assert recovery_s < 60


def test_turn_that_kills_its_worker_every_time_fails_after_max_attempts(  # type: ignore[no-untyped-def]
    make_pool, r: redis.Redis
) -> None:
    pool: WorkerPool = make_pool(lease_ms=1000, sweep_interval_s=0.5, max_attempts=2)
    pool.start(1)
    cid = f"doom-{uuid.uuid4().hex[:8]}"
    with pool.client() as client:
        doomed = client.submit(cid, "crash please", agent="crasher")
        later = client.submit(cid, "still here?", agent="echo")
        deadline = time.monotonic() + 90
        # Supervise like systemd or Kubernetes would: restart whatever died.
        while doomed.status() not in ("failed", "succeeded") and time.monotonic() < deadline:
            if not any(w.alive() for w in pool.workers):
                pool.start(1)
            time.sleep(0.1)
        result = doomed.wait(5, raise_on_error=False)
        assert result.status == "failed"
        assert isinstance(result.error, TurnFailedError)
        assert result.error.remote_type == "MaxAttemptsExceededError"
        # Its workers never came back to report the runs: they crashed, and it says so.
        assert "worker died in 2 runs" in result.error.message
        assert "crash or an OOM kill" in result.error.message
        details = result.error.details["remote_details"]
        assert (details["crashed_runs"], details["cut_off_runs"]) == (2, 0)
        assert int(r.get(_tkey(pool, "crashes")) or 0) == 2
        if not any(w.alive() for w in pool.workers):
            pool.start(1)
        assert later.wait(30).text == "seen: still here?"
        assert [m.text for m in client.history(cid)] == ["still here?", "seen: still here?"]


def test_unanswered_approval_expires_and_the_conversation_moves_on(  # type: ignore[no-untyped-def]
    make_pool, r: redis.Redis
) -> None:
    pool: WorkerPool = make_pool(approval_ttl_s=600, sweep_interval_s=0.5)
    pool.start(1)
    cid = f"expire-{uuid.uuid4().hex[:8]}"
    with pool.client() as client, webhook_receiver() as hooks:
        parked = client.submit(cid, "pay", agent="approver", callback_url=f"{hooks.url}/expired")
        assert parked.wait(30).status == "awaiting_approval"
        later = client.submit(cid, "later", agent="echo", callback_url=f"{hooks.url}/later")
        # The parked lease lives as long as the approval may wait (its PX): ending it is
        # the approval's expiry, done by the test rather than raced against a 1 s ttl.
        assert r.delete(KeySchema(pool.prefix).lease(cid)) == 1
        result = parked.wait(30, raise_on_error=False, until="final")
        assert result.status == "expired" and result.text == ""
        assert isinstance(result.error, TurnFailedError)
        assert result.error.remote_type == "ApprovalExpiredError"
        [(call_id, decision)] = result.decisions.items()
        assert decision.expired and not decision.approved and decision.at_ms
        assert later.wait(30).text == "seen: pay | later"
        # The expired turn is stored: its tool result tells the model the call never ran.
        history = client.history(cid)
        assert [m.role.value for m in history] == ["user", "assistant", "tool", "user", "assistant"]
        assert history[2].tool_call_id == call_id and "approval expired" in history[2].text
        events = list(parked.events(timeout=10))
        assert events[-1].type == "done" and events[-1].data == {"status": "expired"}
        assert [e.data["call_id"] for e in events if e.type == "decision"] == [call_id]
        # The expired turn gets its webhook like any finished turn, once: by the time both
        # webhooks arrived, it was not sent a second time.
        wait_until(lambda: hooks.posts("/later") and hooks.posts("/expired"), 30)
        [(_, _, headers, body)] = hooks.posts("/expired")
        assert verify_signature(WEBHOOK_SECRET, headers[SIGNATURE_HEADER], body)
        payload = json.loads(body)
        assert payload["turn_id"] == parked.turn_id and payload["status"] == "expired"
        assert payload["decisions"][call_id]["expired"] is True


def test_worker_refuses_a_dataset_that_came_back_empty(make_pool, r: redis.Redis) -> None:  # type: ignore[no-untyped-def]
    pool: WorkerPool = make_pool(sweep_interval_s=0.5)
    [stale] = pool.start(1)
    epoch = KeySchema(pool.prefix).epoch()
    with pool.client() as client:
        assert client.submit(f"ep-{uuid.uuid4().hex[:6]}", "before", agent="echo").wait(30).ok
        first = r.get(epoch)
        assert first
        r.delete(epoch)  # to the worker, Redis came back without its data
        wait_until(lambda: r.get(epoch) not in (None, first), 30, what="the sweeper's check")
        wait_until(lambda: "not serving" in stale.log_tail(200), 30, what="the refusal")
        turn = client.submit(f"ep-{uuid.uuid4().hex[:6]}", "after", agent="echo")
        with pytest.raises(TurnTimeoutError):
            turn.wait(3)  # the stale worker takes no kicks any more
        pool.start(1)  # a worker started on the current dataset serves it
        assert turn.wait(30).text == "seen: after"


@pytest.mark.fast_paths  # with them off a worker takes no kick beyond its slots
def test_kicks_a_killed_worker_held_back_run_on_another(make_pool, r: redis.Redis) -> None:  # type: ignore[no-untyped-def]
    """A kick is a hint (the inbox holds the turn): the kicks a worker took from the
    broker but had not started when it was killed are not restored by the broker (with
    the fast paths on, kombu keeps no unacked note), and the sweeper kicks those
    conversations again."""
    pool: WorkerPool = make_pool(lease_ms=5000, sweep_interval_s=1.0, concurrency=1, partitions=1)
    [first] = pool.start(1)
    word = uuid.uuid4().hex[:8]
    with pool.client() as client:
        blocked = client.submit(f"held-a-{word}", f"{word} block", agent="blocker")
        wait_until(lambda: r.llen(_tkey(pool, "ran", word)) == 1, 30, what="the model call")
        # The one slot is busy: the next conversations' kicks wait inside the worker.
        waiting = [client.submit(f"held-{n}-{word}", f"{word} {n}", agent="echo") for n in (1, 2)]
        queue = f"{pool.prefix}.p0"
        wait_until(lambda: r.llen(queue) == 0, 30, what="the worker taking the kicks")
        first.kill()
        r.set(_tkey(pool, "release", word), 1)
        pool.start(1)
        for n, handle in zip((1, 2), waiting, strict=True):
            assert handle.wait(60).text == f"seen: {word} {n}"
        assert blocked.wait(60).text == f"released {word} block"


class _HangingFirst(BaseHTTPRequestHandler):
    """A webhook receiver whose first POST gets no answer until ``release`` is set (the
    worker delivering it is killed meanwhile); every later POST is answered 200."""

    posts: list[bytes] = []
    release = threading.Event()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).posts.append(body)
        if len(type(self).posts) == 1:
            type(self).release.wait(30)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        return


def test_a_callback_whose_worker_died_delivering_it_is_sent_again(
    make_pool, r: redis.Redis
) -> None:  # type: ignore[no-untyped-def]
    """The callbacks a worker owes stay in Redis until delivered: a worker killed in the
    middle of a delivery (the task gone with it: with the fast paths on the broker keeps
    no unacked note) leaves the callback owed, and the sweeper sends it again."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HangingFirst)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    pool: WorkerPool = make_pool(sweep_interval_s=0.5, webhook_redeliver_after_s=3)
    [first] = pool.start(1)
    owed = KeySchema(pool.prefix).owed_callbacks()
    try:
        with pool.client() as client:
            cid = f"owed-{uuid.uuid4().hex[:8]}"
            handle = client.submit(cid, "call me back", agent="echo", callback_url=url)
            tid = handle.turn_id
            assert handle.wait(30).text == "seen: call me back"
            wait_until(lambda: _HangingFirst.posts, 30, what="the first delivery")
            assert r.zcard(owed) == 1  # owed while its delivery is in flight
            first.kill()
            _HangingFirst.release.set()
            pool.start(1)
            wait_until(lambda: len(_HangingFirst.posts) >= 2, 60, what="the delivery again")
            wait_until(lambda: r.zcard(owed) == 0, 30, what="the callback settled")
        bodies = [json.loads(body) for body in _HangingFirst.posts]
        assert {body["turn_id"] for body in bodies} == {tid}
    finally:
        server.shutdown()
        server.server_close()

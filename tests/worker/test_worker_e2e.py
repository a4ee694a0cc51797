"""The distributed flow on real worker processes: memory, order, approvals, callbacks,
idempotency and cancel. Three workers (one module-scoped pool) on the test Redis; the
end-to-end test runs again with RabbitMQ as the broker."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from convoq import FilePart, ImagePart, Message, RecordedTokenCounter, TextPart
from convoq.cli.demo import tiny_pdf, tiny_png
from convoq.client import SIGNATURE_HEADER, Client, TurnResult, verify_signature
from convoq.errors import InvalidMessageError, ModelError
from convoq.messages import MessageRole
from convoq.redis.keys import KeySchema
from tests.support import services
from tests.support.rabbitmq import AMQP_URL, delete_amqp_queues
from tests.support.redis_server import RedisServer
from tests.support.workers import (
    ROOT,
    WEBHOOK_SECRET,
    WebhookReceiver,
    WorkerPool,
    module_pool,
    running_pool,
    wait_until,
    webhook_receiver,
)

# Run again with the fast paths off by `make test-slowpaths`.
pytestmark = [pytest.mark.slow, pytest.mark.slowpaths]
MAX_TURN_BYTES = 64 * 1024  # far above any turn here but the "oversize" profile's

pool = module_pool(3, max_turn_bytes=MAX_TURN_BYTES)


@pytest.fixture(scope="module")
def amqp_pool(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerPool]:
    services.rabbitmq()
    logs = tmp_path_factory.mktemp("amqp-workers")
    with running_pool(redis_server.url, logs, 1, broker_url=AMQP_URL, partitions=2) as started:
        yield started
    delete_amqp_queues(started)


def _cid(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _tkey(pool: WorkerPool, *parts: str) -> str:
    return ":".join([pool.prefix, "test", *parts])


# 1 and 7 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("broker", ["redis", "amqp"])
def test_end_to_end_memory_attachments_and_failures(
    broker: str, request: pytest.FixtureRequest
) -> None:
    pool: WorkerPool = request.getfixturevalue("pool" if broker == "redis" else "amqp_pool")
    png, pdf = tiny_png(), tiny_pdf("convoq test")
    cid = _cid(f"e2e-{broker}")
    with pool.client() as client:
        first = Message(
            content=[
                TextPart(text="look at these"),
                ImagePart(data=png, mime_type="image/png"),
                FilePart(data=pdf, mime_type="application/pdf", filename="notes.pdf"),
            ]
        )
        h1 = client.submit(cid, first, agent="echo")
        h2 = client.submit(cid, "and now?", agent="echo")
        files = f"image/png:None:{_digest(png)}, application/pdf:notes.pdf:{_digest(pdf)}"
        assert h1.wait(30).text == f"seen: look at these files: {files}"
        # The second turn's model saw the first turn, attachments restored from Redis.
        assert h2.wait(30).text == f"seen: look at these | and now? files: {files}"

        history = client.history(cid)
        assert [m.role for m in history] == [MessageRole.USER, MessageRole.ASSISTANT] * 2
        stored = history[0].attachments
        assert [p.data for p in stored] == [png, pdf]
        assert isinstance(stored[1], FilePart) and stored[1].filename == "notes.pdf"

        failed = client.submit(cid, "boom", agent="failer")
        with pytest.raises(ModelError, match="on purpose"):
            failed.wait(30)
        result = failed.wait(30, raise_on_error=False)
        assert result.status == "failed" and isinstance(result.error, ModelError)
        after = client.submit(cid, "after", agent="echo").wait(30)
        assert after.text.startswith("seen: look at these | and now? | after")
        assert len(client.history(cid)) == 6  # the failed turn stored nothing


def test_turn_too_big_to_store_fails_and_the_conversation_goes_on(client: Client) -> None:
    cid = _cid("oversize")
    big = client.submit(cid, "say a lot", agent="oversize")
    after = client.submit(cid, "after", agent="echo")
    result = big.wait(30, raise_on_error=False)
    assert result.status == "failed"
    assert isinstance(result.error, InvalidMessageError)
    # The workers' CONVOQ_MAX_TURN_BYTES is the limit that refused it.
    assert result.error.details["rule"] == "max_turn_bytes"
    assert result.error.details["limit"] == MAX_TURN_BYTES
    assert after.wait(30).text == "seen: after"
    assert [m.text for m in client.history(cid)] == ["after", "seen: after"]


def test_keep_last_turns_limits_what_the_model_sees(client: Client) -> None:
    cid = _cid("window")
    for text in ["one", "two", "three"]:
        client.submit(cid, text, agent="echo")
    last = client.submit(cid, "four", agent="echo", keep_last_turns=1).wait(30)
    assert last.text == "seen: three | four"
    profile = client.submit(cid, "five", agent="short_memory").wait(30)
    assert profile.text == "seen: four | five"
    assert len(client.history(cid)) == 10


def test_token_budget_and_awkward_ids_through_the_workers(client: Client) -> None:
    cid = _cid("o'brien {user 42}/ü/..")
    for text in ["one", "two", "three"]:
        client.submit(cid, text, agent="echo")
    newest = [Message.user("three"), Message.assistant("seen: one | two | three")]
    budget = RecordedTokenCounter().count(newest)  # only the newest turn fits
    assert client.submit(cid, "four", agent="echo", max_history_tokens=budget).wait(30).text == (
        "seen: three | four"
    )
    assert client.submit(cid, "five", agent="echo", max_history_tokens=0).wait(30).text == (
        "seen: five"
    )
    assert len(client.history(cid)) == 10
    assert client.history(cid + "x") == []


def test_a_compact_task_summarises_behind_the_turns(client: Client) -> None:
    from convoq.memory.redis import RedisConversationMemory

    cid = _cid("compacted")
    for text in ["one", "two", "three"]:
        assert client.submit(cid, text, agent="compacting").wait(30).status == "succeeded"
    memory = RedisConversationMemory(client.redis_url, prefix=client.prefix)
    try:
        summary = None
        for _ in range(300):  # readiness: the compact task runs on a worker after the turn
            summary = memory.summary(cid)
            if summary is not None:
                break
            time.sleep(0.05)
        assert summary is not None and summary.watermark == 2
        assert summary.text.endswith("users said one, two")
        # Summarised turns are no longer sent; the full history stays stored.
        assert client.submit(cid, "four", agent="compacting").wait(30).text == (
            "seen: three | four"
        )
        assert len(client.history(cid)) == 8
    finally:
        memory.close()


# 2 ---------------------------------------------------------------------------------------
def test_turns_of_a_conversation_run_one_at_a_time_in_order(
    client: Client, pool: WorkerPool, r: redis.Redis
) -> None:
    conversations = [_cid(f"order{i}") for i in range(20)]
    handles = {cid: [] for cid in conversations}  # type: dict[str, list[Any]]
    for turn in range(10):
        for cid in conversations:
            handles[cid].append(client.submit(cid, f"{cid} t{turn}", agent="tracker"))
    for cid in conversations:
        for handle in handles[cid]:
            assert handle.wait(60).status == "succeeded"
    assert r.smembers(_tkey(pool, "overlap")) == set()
    for cid in conversations:
        expected = [f"{cid} t{turn}" for turn in range(10)]
        ran = [x.decode() for x in r.lrange(_tkey(pool, "order", cid), 0, -1)]
        assert ran == expected
        users = [m.text for m in client.history(cid) if m.role == MessageRole.USER]
        assert users == expected


# 4 ---------------------------------------------------------------------------------------
def _parked(client: Client, cid: str, text: str) -> tuple[Any, TurnResult]:
    handle = client.submit(cid, text, agent="approver")
    parked = handle.wait(30)
    assert parked.status == "awaiting_approval"
    assert [c.name for c in parked.pending_approvals] == ["transfer"]
    return handle, parked


def test_approval_from_another_process_resumes_on_another_worker(
    client: Client, pool: WorkerPool, r: redis.Redis
) -> None:
    cid = _cid("approve")
    handle, parked = _parked(client, cid, "pay")
    later = client.submit(cid, "later", agent="echo")
    # The workers move on to other conversations while this one waits.
    assert client.submit(_cid("other"), "meanwhile", agent="echo").wait(30).ok
    assert later.status() == "queued"
    parked_pid = int(r.lrange(_tkey(pool, "parked_pid"), -1, -1)[0])
    parker = next(w for w in pool.workers if w.pid == parked_pid)
    parker.stop()  # so the resume must run in a different worker process
    try:
        approve = [sys.executable, "-m", "convoq.cli", "approve", cid, handle.turn_id]
        done = subprocess.run(
            [*approve, parked.pending_approvals[0].id],
            env=pool.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        result = handle.wait(30)
        assert result.text.startswith("after tool: transferred 5 in pid")
        assert int(r.lrange(_tkey(pool, "resumed_pid"), -1, -1)[0]) != parked_pid
        assert later.wait(30).text == "seen: pay | later"
    finally:
        pool.workers.remove(parker)
        pool.start(1)


def test_deny_and_discard(client: Client, pool: WorkerPool, r: redis.Redis) -> None:
    cid = _cid("deny")
    transfers = r.llen(_tkey(pool, "transfers"))
    handle, parked = _parked(client, cid, "pay")
    client.deny(handle, parked.pending_approvals[0].id, reason="too much")
    denied = handle.wait(30)
    assert "denied" in denied.text and "too much" in denied.text

    second, _ = _parked(client, cid, "pay again")
    later = client.submit(cid, "later", agent="echo")
    client.discard(second)
    assert second.wait(30, raise_on_error=False).status == "cancelled"
    assert later.wait(30).text == "seen: pay | later"
    assert r.llen(_tkey(pool, "transfers")) == transfers  # no tool ran without approval


# 5 ---------------------------------------------------------------------------------------
@pytest.fixture
def receiver() -> Iterator[tuple[str, WebhookReceiver]]:
    with webhook_receiver(fail_first={"/hook/a"}) as hooks:
        yield hooks.url, hooks


def test_on_done_fires_once(client: Client) -> None:
    cid = _cid("ondone")
    calls: list[TurnResult] = []
    fired = threading.Event()

    def on_done(result: TurnResult) -> None:
        calls.append(result)
        fired.set()

    handle = client.submit(cid, "hello", agent="echo", on_done=on_done)
    assert fired.wait(30)
    client.submit(cid, "more", agent="echo").wait(30)
    handle.wait(30)
    assert len(calls) == 1
    assert calls[0].turn_id == handle.turn_id and calls[0].text == "seen: hello"


def test_webhook_is_signed_retried_and_delivered_once(
    client: Client, receiver: tuple[str, WebhookReceiver]
) -> None:
    base, handler = receiver
    cid = _cid("hook")
    handle = client.submit(cid, "call me", agent="echo", callback_url=f"{base}/hook/a")
    handle.wait(30)
    wait_until(lambda: any(s[0] == "/hook/a" and s[1] == 200 for s in handler.seen), 30)
    # A second turn's webhook arriving shows the first is not delivered again.
    client.submit(cid, "again", agent="echo", callback_url=f"{base}/hook/b").wait(30)
    wait_until(lambda: any(s[0] == "/hook/b" for s in handler.seen), 30)

    first = [s for s in handler.seen if s[0] == "/hook/a"]
    assert [s[1] for s in first] == [500, 200]  # retried after the 500
    _, _, headers, body = first[-1]
    assert verify_signature(WEBHOOK_SECRET, headers[SIGNATURE_HEADER], body)
    assert client.verify_webhook(headers[SIGNATURE_HEADER], body)
    assert not verify_signature("wrong", headers[SIGNATURE_HEADER], body)
    payload = json.loads(body)
    assert payload["turn_id"] == handle.turn_id
    assert payload["status"] == "succeeded" and payload["text"] == "seen: call me"
    assert payload["usage"]["requests"] == 1  # the echo model reports no tokens
    assert len([s for s in handler.seen if s[0] == "/hook/b"]) == 1


# 6 ---------------------------------------------------------------------------------------
def test_idempotency_key_gives_one_turn(client: Client) -> None:
    cid = _cid("idem")
    first = client.submit(cid, "once", agent="echo", idempotency_key="order-1")
    second = client.submit(cid, "once", agent="echo", idempotency_key="order-1")
    assert second.turn_id == first.turn_id
    first.wait(30)
    third = client.submit(cid, "once", agent="echo", idempotency_key="order-1")
    assert third.turn_id == first.turn_id
    assert len(client.history(cid)) == 2


def test_cancelled_queued_turn_never_runs(client: Client, pool: WorkerPool, r: redis.Redis) -> None:
    cid, word = _cid("cancel"), uuid.uuid4().hex[:8]
    first = client.submit(cid, f"{word} first", agent="blocker")
    wait_until(lambda: r.llen(_tkey(pool, "ran", word)) == 1, 30, what="the first turn runs")
    second = client.submit(cid, f"{word} second", agent="blocker")
    third = client.submit(cid, f"{word} third", agent="echo")
    assert client.cancel(second) == "cancelled"
    r.set(_tkey(pool, "release", word), 1)
    assert first.wait(30).ok
    assert third.wait(30).text == f"seen: {word} first | {word} third"
    assert second.status() == "cancelled"
    assert len(r.lrange(_tkey(pool, "ran", word), 0, -1)) == 1  # the second never ran


def test_cancelled_running_turn_stops_and_stores_nothing(
    client: Client, pool: WorkerPool, r: redis.Redis
) -> None:
    cid, word = _cid("stop"), uuid.uuid4().hex[:8]
    running = client.submit(cid, f"{word} long", agent="blocker")
    wait_until(lambda: r.llen(_tkey(pool, "ran", word)) == 1, 30, what="the turn runs")
    assert client.cancel(running) == "stopping"
    r.set(_tkey(pool, "release", word), 1)
    assert running.wait(30, raise_on_error=False).status == "cancelled"
    assert client.history(cid) == []
    assert client.submit(cid, "next", agent="echo").wait(30).text == "seen: next"
    assert not r.exists(KeySchema(pool.prefix).lease(cid))


def test_events_stream_status_changes_and_done(client: Client) -> None:
    handle = client.submit(_cid("events"), "stream me please", agent="echo")
    events = list(handle.events(timeout=30))
    kinds = [e.type for e in events]
    assert kinds[-1] == "done" and events[-1].data["status"] == "succeeded"
    statuses = [e.data["status"] for e in events if e.type == "status"]
    assert "running" in statuses
    deltas = "".join(e.data["text"] for e in events if e.type == "text_delta")
    assert deltas == "seen: stream me please"

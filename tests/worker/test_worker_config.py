"""Worker Celery config: JSON only, never pickle (a pickled task is refused, not run);
task events as configured."""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Iterator

import pytest
import redis
from kombu import Connection
from kombu.exceptions import ContentDisallowed
from kombu.serialization import loads

from convoq import Message
from convoq.queue import routing
from convoq.queue.transport import celery_base_config
from convoq.redis.keys import KeySchema
from convoq.redis.protocol import TurnProtocol
from convoq.settings import ConvoqSettings
from convoq.worker.app import worker_config
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerPool]:
    """One worker whose sweeper never sweeps: the test holds the sweep lock from before the
    worker starts, so only a kick from the broker could start a turn in this module (a
    sweep at start-up would otherwise race the test's submit and run its turn)."""
    started = WorkerPool(redis_server.url, tmp_path_factory.mktemp("workers"), sweep_interval_s=600)
    with redis.Redis.from_url(redis_server.url) as r:
        r.set(KeySchema(started.prefix).sweeper_lock(), "held-by-the-test", px=3_600_000)
    try:
        started.start(1)
        yield started
    finally:
        started.stop_all()


def test_every_celery_config_accepts_json_only() -> None:
    for config in (celery_base_config("redis://x"),
                   worker_config(ConvoqSettings(), "redis://x")):  # fmt: skip
        assert config["accept_content"] == ["json"]
        assert config["task_serializer"] == config["result_serializer"] == "json"
    with pytest.raises(ContentDisallowed):
        loads(pickle.dumps({"x": 1}), "application/x-python-serialize", "binary",
              accept=celery_base_config("redis://x")["accept_content"])  # fmt: skip


async def test_a_pickled_drain_is_refused_and_runs_nothing(pool: WorkerPool) -> None:
    cid, tid = f"pickle-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    proto = TurnProtocol.from_url(pool.redis_url, prefix=pool.prefix)
    try:
        # Queued in Redis without a kick, so nothing but the message below could run it.
        await proto.submit(cid, tid, agent="echo", message=Message.user("hi"), options={})
        queue = routing.route(cid, prefix=pool.prefix, partitions=pool.partitions)
        with Connection(pool.redis_url) as conn:
            conn.SimpleQueue(queue, serializer="pickle").put(
                {"task": routing.DRAIN_TASK, "args": [cid]},
                headers={"task": routing.DRAIN_TASK, "id": tid, "lang": "py"},
            )
        worker = pool.workers[0]
        wait_until(lambda: "untrusted content" in worker.log_tail(200), 30,
                   what="the worker to refuse the pickled message")  # fmt: skip
        assert (await proto.get_turn(cid, tid)).status == "queued"
    finally:
        await proto.clear(cid, force=True)
        await proto.close()


def test_task_events_follow_the_setting() -> None:
    quiet = worker_config(ConvoqSettings(), "redis://x")
    assert quiet["worker_send_task_events"] is False
    assert quiet["task_send_sent_event"] is False
    loud = worker_config(ConvoqSettings(task_events=True), "redis://x")
    assert loud["worker_send_task_events"] is True
    assert loud["task_send_sent_event"] is True


def test_kombu_keeps_no_unacked_notes_with_the_fast_paths_on() -> None:
    fast = worker_config(ConvoqSettings(fast_paths=True), "redis://x")
    assert fast["broker_transport_options"]["ack_emulation"] is False
    assert fast["broker_transport_options"]["visibility_timeout"] > 0
    plain = worker_config(ConvoqSettings(fast_paths=False), "redis://x")
    assert "ack_emulation" not in plain["broker_transport_options"]


def _zadds(url: str) -> int:
    with redis.Redis.from_url(url) as r:
        return int(r.info("commandstats").get("cmdstat_zadd", {}).get("calls", 0))


def test_a_kicked_turn_costs_the_broker_no_unacked_note_with_the_fast_paths_on(
    pool: WorkerPool,
) -> None:
    # kombu notes a delivered message as unacked with a ZADD (convoq itself sends none).
    before = _zadds(pool.redis_url)
    with pool.client() as client:
        result = client.submit(f"acks-{uuid.uuid4().hex[:8]}", "hi", agent="echo").wait(30)
    assert result.status == "succeeded"
    noted = _zadds(pool.redis_url) - before
    if ConvoqSettings().fast_paths:
        assert noted == 0
    else:
        assert noted >= 1

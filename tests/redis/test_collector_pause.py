"""The collector pause around long decodes is one pause for the whole process: decodes
overlapping on several threads keep it until the last one ends, and a collector the
caller turned off stays off. A worker freezes its start-up heap out of the collector's
walks."""

from __future__ import annotations

import gc
import json
import threading
from pathlib import Path

import pytest
import redis

from convoq.redis._codec import BULK, collector_paused
from convoq.redis.keys import KeySchema
from tests.support.workers import running_pool


def test_overlapping_decodes_on_two_threads_keep_the_collector_paused_until_the_last_ends() -> None:
    assert gc.isenabled()
    other_in, other_may_end = threading.Event(), threading.Event()

    def other() -> None:
        with collector_paused(BULK):  # the other thread's decode starts first
            other_in.set()
            assert other_may_end.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    assert other_in.wait(10)
    with collector_paused(BULK):
        other_may_end.set()
        thread.join(10)
        assert not thread.is_alive()
        # The first decode ended; this one still runs with the collector paused.
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_caller_meanwhile_is_not_turned_on_by_a_later_pause() -> None:
    gc.disable()
    try:
        with collector_paused(BULK), collector_paused(BULK):
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.slow
def test_a_worker_freezes_its_start_up_heap(
    redis_url: str, tmp_path: Path, redis_client: redis.Redis
) -> None:
    with running_pool(redis_url, tmp_path, 1) as pool:
        entry = redis_client.hget(KeySchema(pool.prefix).workers(), pool.workers[0].name)
    assert entry is not None
    # Celery, kombu and convoq's modules: far more than a bare interpreter's few thousand.
    assert json.loads(entry)["frozen_objects"] > 50_000

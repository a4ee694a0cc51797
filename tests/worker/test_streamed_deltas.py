"""Streamed text on a worker: the deltas a reader gets, live (``events()``, the SSE
route's reader) or afterwards, add up to the final text; a live reader sees the first
words while the model still streams, within the coalescing bound
(``CONVOQ_DELTA_FLUSH_MS``), not only at the end of the turn."""

from __future__ import annotations

import threading
import time
import uuid

import redis

from convoq.client import Client
from convoq.turn_state import TurnEvent
from tests.support.delta_agents import FIRST, LONG, REST
from tests.support.workers import WorkerPool, module_pool

FLUSH_MS = 200


pool = module_pool(1, agents="tests.support.delta_agents", delta_flush_ms=FLUSH_MS)


def text_of(events: list[TurnEvent]) -> str:
    return "".join(e.data["text"] for e in events if e.type == "text_delta")


def test_the_deltas_add_up_to_the_final_text_live_or_read_afterwards(client: Client) -> None:
    handle = client.submit(f"long-{uuid.uuid4().hex[:8]}", "talk", agent="long_reply")
    live = list(handle.events(timeout=30))
    assert live[-1].type == "done"
    assert text_of(live) == LONG == handle.wait(30).text
    afterwards = list(client.handle(handle.conversation_id, handle.turn_id).events(timeout=30))
    assert text_of(afterwards) == LONG
    # Coalesced: the reply's 50-odd words reached the stream as a few events.
    assert sum(e.type == "text_delta" for e in afterwards) <= 3


def test_a_live_reader_sees_the_first_words_within_the_bound(
    client: Client, pool: WorkerPool, r: redis.Redis
) -> None:
    word = uuid.uuid4().hex[:8]
    handle = client.submit(f"paced-{word}", word, agent="paced")
    seen: list[tuple[float, TurnEvent]] = []

    def read() -> None:
        for event in handle.events(timeout=60):
            seen.append((time.monotonic(), event))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        deadline = time.monotonic() + 30
        while not any(e.type == "text_delta" for _, e in seen) and time.monotonic() < deadline:
            time.sleep(0.01)
        # The model still waits for its release: the first words came on their own.
        assert text_of([e for _, e in seen]) == FIRST
        assert not any(e.type in ("assistant", "done") for _, e in seen)
    finally:
        r.set(f"{pool.prefix}:test:release:{word}", 1)  # test_key() in the worker
        reader.join(60)
    assert text_of([e for _, e in seen]) == FIRST + REST
    running = next(t for t, e in seen if e.type == "status" and e.data["status"] == "running")
    first = next(t for t, e in seen if e.type == "text_delta")
    assert first - running < 10 * FLUSH_MS / 1000  # the bound, with room for a loaded machine

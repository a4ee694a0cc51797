"""A model stream that drops after some of its text went out is retried on a worker: the
turn succeeds, and its event stream says the first attempt's text is void
(``text_retracted``) before the retry's text; the text after the last retraction is the
turn's answer, for a reader afterwards and for one reading live."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from convoq.turn_state import TurnEvent
from tests.support.openai_server import OpenAIServer
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool, running_pool

WORDS = ["The ", "answer ", "is ", "forty-two."]


@pytest.fixture
def model_server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as server:
        yield server


@pytest.fixture
def pool(
    model_server: OpenAIServer,
    redis_server: RedisServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[WorkerPool]:
    monkeypatch.setenv("RETRACT_MODEL_URL", model_server.url)  # the worker inherits it
    with running_pool(
        redis_server.url, tmp_path, 1, agents="tests.support.retract_agents", delta_flush_ms=0
    ) as started:
        yield started


def text_after_last_retraction(events: list[TurnEvent]) -> str:
    kinds = [e.type for e in events]
    last = len(kinds) - kinds[::-1].index("text_retracted") if "text_retracted" in kinds else 0
    return "".join(e.data["text"] for e in events[last:] if e.type == "text_delta")


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
def test_a_stream_dropped_after_its_text_went_out_is_retracted_and_retried(
    pool: WorkerPool, model_server: OpenAIServer, reset: bool
) -> None:
    model_server.reply_stream(WORDS, cut_after=2, reset=reset)  # "The ", "answer ", the drop
    model_server.reply_stream(WORDS)
    with pool.client() as client:
        handle = client.submit(f"retract-{uuid.uuid4().hex[:8]}", "ask", agent="streamer")
        live = list(handle.events(timeout=60))
        result = handle.wait(60)
        afterwards = list(client.handle(handle.conversation_id, handle.turn_id).events(timeout=30))
    assert result.status == "succeeded" and result.text == "".join(WORDS)
    assert len(model_server.requests) == 2
    for events in (live, afterwards):
        kinds = [e.type for e in events]
        assert kinds.count("text_retracted") == 1, kinds
        before = events[: kinds.index("text_retracted")]
        first = "".join(e.data["text"] for e in before if e.type == "text_delta")
        assert first == "The answer ", kinds  # what went out before the drop
        retraction = events[kinds.index("text_retracted")].data
        assert retraction == {"reason": "model_retry", "retry": 1}
        assert text_after_last_retraction(events) == result.text

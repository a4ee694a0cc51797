"""A real worker runs a queued typed-output turn on the Anthropic profile: the turn's
sampling settings reach the Messages API body, the retry request ends with the correction
as a user turn, and the conversation's next turn carries no retry prompt in ``system``."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support import sdk_wire as w
from tests.support.openai_server import OpenAIServer
from tests.support.redis_server import RedisServer
from tests.support.workers import running_pool

CITY: dict[str, Any] = {
    "title": "City",
    "type": "object",
    "properties": {"name": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["name", "population"],
    "additionalProperties": False,
}


def answer(server: OpenAIServer, value: dict[str, Any]) -> None:
    block = w.tool_use_block("toolu_out", "City", value)
    server.reply_raw(w.anthropic_message([block], stop_reason="tool_use").model_dump_json())


def test_a_queued_typed_turn_on_anthropic_retries_as_a_user_turn_with_its_settings(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with OpenAIServer() as claude:
        monkeypatch.setenv("TEST_ANTHROPIC_URL", claude.url.removesuffix("/v1"))
        monkeypatch.setenv("TEST_RESPONSES_URL", claude.url)  # the profile module wants it
        for value in ({"name": "Oslo"}, {"name": "Oslo", "population": 7}, {"name": "Bergen",
                      "population": 3}):  # fmt: skip
            answer(claude, value)
        settings = {"temperature": 0.2, "top_p": 0.5}
        with (
            running_pool(redis_server.url, tmp_path, 1, agents="tests.support.api_agents") as pool,
            pool.client() as client,
        ):
            cid = f"retry-{uuid.uuid4().hex[:8]}"
            first = client.submit(cid, "Largest?", agent="claude", output_type=CITY,
                                  model_settings=settings)  # fmt: skip
            assert first.wait(60).output == {"name": "Oslo", "population": 7}
            second = client.submit(cid, "Second?", agent="claude", output_type=CITY)
            assert second.wait(60).output == {"name": "Bergen", "population": 3}
    bodies = [request.json for request in claude.requests]
    for body in bodies:
        w.check_anthropic_body(body)
    assert [(b.get("temperature"), b.get("top_p")) for b in bodies] == [(0.2, 0.5)] * 2 + [
        (None, None)
    ]
    instructions = [{"type": "text", "text": "Be brief."}]
    assert [b["system"] for b in bodies] == [instructions] * 3
    retry = bodies[1]["messages"]
    assert [m["role"] for m in retry] == ["user", "assistant", "user"]
    correction = retry[-1]["content"][-1]["text"]
    assert "population" in correction
    # The next turn: the correction in its place, after the rejected answer.
    later = bodies[2]["messages"]
    assert [m["role"] for m in later] == ["user", "assistant", "user", "assistant", "user"]
    assert later[2]["content"] == [{"type": "text", "text": correction}]

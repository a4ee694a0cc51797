"""A real worker process runs profiles on the Anthropic and Responses models: one
conversation's turns go to one API, then the other, tool calls in between."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.support import sdk_wire as w
from tests.support.openai_server import OpenAIServer
from tests.support.redis_server import RedisServer
from tests.support.workers import running_pool


def test_worker_profiles_on_the_anthropic_and_responses_models(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with OpenAIServer() as claude, OpenAIServer() as gpt:
        monkeypatch.setenv("TEST_ANTHROPIC_URL", claude.url.removesuffix("/v1"))
        monkeypatch.setenv("TEST_RESPONSES_URL", gpt.url)
        call = w.tool_use_block("toolu_1", "get_weather", {"city": "Oslo"})
        claude.reply_raw(w.anthropic_message([call], stop_reason="tool_use").model_dump_json())
        claude.reply_raw(w.anthropic_message([w.text_block("Sunny in Oslo.")]).model_dump_json())
        gpt.reply_raw(w.response([w.text_item("Still sunny.")]).model_dump_json())
        with (
            running_pool(redis_server.url, tmp_path, 1, agents="tests.support.api_agents") as pool,
            pool.client() as client,
        ):
            cid = f"apis-{uuid.uuid4().hex[:8]}"
            first = client.submit(cid, "Oslo?", agent="claude")
            second = client.submit(cid, "And now?", agent="gpt")
            assert first.wait(60).text == "Sunny in Oslo."
            assert second.wait(60).text == "Still sunny."
        for request in claude.requests:
            w.check_anthropic_body(request.json)
        for request in gpt.requests:
            w.check_responses_body(request.json)
        # The Responses turn saw the Anthropic turn's tool call and result.
        items = gpt.requests[0].json["input"]
        assert [i.get("type") for i in items[2:4]] == ["function_call", "function_call_output"]
        assert items[3] == {"type": "function_call_output", "call_id": "toolu_1",
                            "output": "Oslo: sunny"}  # fmt: skip

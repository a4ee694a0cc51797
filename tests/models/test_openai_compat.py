"""What differs between OpenAI-compatible servers (the table on the docs' model APIs page,
docs/models.md), one test each, against the loopback server playing such a server."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from convoq import Agent
from convoq.memory import InMemoryConversationMemory
from convoq.messages import Message
from convoq.models import ModelRequest, ToolSpec, openai, responses
from tests.support import sdk_wire as w
from tests.support.openai_server import OpenAIServer

LOOSE = ToolSpec(name="f", parameters={"type": "object", "properties": {"a": {"type": "string"}}})


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as running:
        yield running


def ask() -> ModelRequest:
    return ModelRequest(messages=[Message.user("hi")])


async def test_local_servers_need_no_key(
    server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.reply_text("ok")
    server.reply_raw(w.response([w.text_item("ok")]).model_dump_json())
    for model in (openai("llama3.2", base_url=server.url), responses("m", base_url=server.url)):
        async with model:
            assert (await model.request(ask())).text == "ok"
    assert all("authorization" not in r.headers for r in server.requests)


async def test_azure_takes_its_key_in_api_key_and_a_version_in_the_query(
    server: OpenAIServer,
) -> None:
    server.reply_text("ok")
    server.reply_raw(w.response([w.text_item("ok")]).model_dump_json())
    options = {
        "base_url": server.url,
        "api_key": "az-key",
        "api_key_header": "api-key",
        "query": {"api-version": "2025-04-01-preview"},
    }
    for model in (openai("my-deployment", **options), responses("my-deployment", **options)):
        async with model:
            await model.request(ask())
    for request, path in zip(server.requests, ("chat/completions", "responses"), strict=True):
        assert request.headers["api-key"] == "az-key"
        assert "authorization" not in request.headers
        assert request.path == f"/v1/{path}?api-version=2025-04-01-preview"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_server_that_reports_no_usage(server: OpenAIServer, stream: bool) -> None:
    server.reply_text("no counts", usage=None)
    agent = Agent(
        openai("m", base_url=server.url), memory=InMemoryConversationMemory(), conversation_id="c"
    )
    if stream:
        events = [e async for e in agent.astream("hi")]
        assert events[-1].data["usage"]["total_tokens"] == 0
    else:
        response = await agent.agenerate("hi")
        assert response.text == "no counts"
        assert (response.usage.requests, response.usage.total_tokens) == (1, 0)
    stored = await agent.memory.aload("c")
    assert stored[-1].usage is None
    server_without_usage = w.response([w.text_item("ok")], usage=None).model_dump_json()
    server.reply_raw(server_without_usage)
    async with responses("m", base_url=server.url) as model:
        assert (await model.request(ask())).usage is None


async def test_servers_without_strict_schemas(server: OpenAIServer) -> None:
    server.reply_text("ok")
    server.reply_raw(w.response([w.text_item("ok")]).model_dump_json())
    request = ModelRequest(messages=[Message.user("hi")], tools=[LOOSE])
    async with openai("m", base_url=server.url) as chat:
        await chat.request(request)
    async with responses("m", base_url=server.url, strict_tools=False) as model:
        await model.request(request)
    chat_tool, responses_tool = (r.json["tools"][0] for r in server.requests)
    assert "strict" not in json.dumps(chat_tool)  # Chat Completions tools go without it
    assert responses_tool["strict"] is False  # the Responses API needs it said: false


async def test_a_server_that_ignores_stream_true(server: OpenAIServer) -> None:
    completion = {"choices": [{"message": {"role": "assistant", "content": "whole"}}]}
    server.reply_raw(json.dumps(completion))  # application/json, not an event stream
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    async with openai("m", base_url=server.url) as chat:
        assert (await chat.request(ask(), on_text_delta=on_delta)).text == "whole"
    assert deltas == ["whole"]


async def test_headers_given_win_over_the_key_header(server: OpenAIServer) -> None:
    # e.g. Azure with a Microsoft Entra ID token instead of a key
    server.reply_text("ok")
    entra = {"Authorization": "Bearer entra-token"}
    async with openai("my-deployment", base_url=server.url, api_key="k", headers=entra) as chat:
        await chat.request(ask())
    assert server.requests[0].headers["authorization"] == "Bearer entra-token"

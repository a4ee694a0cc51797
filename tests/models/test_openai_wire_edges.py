"""OpenAI wire edge cases against the loopback server: n>1 streams, refusals, deadlines,
finish_reason "length", SDK-compatible retries, usage, and GenerationRequest."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from convoq import Agent, GenerationRequest, Message
from convoq.client._base import build_submission
from convoq.errors import (
    InvalidMessageError,
    ModelError,
    ModelHTTPError,
    ModelTimeoutError,
    TruncatedAnswerError,
)
from convoq.limits import Limits
from convoq.memory import InMemoryConversationMemory
from convoq.messages import MessageRole
from convoq.models import ModelRequest, OpenAIChatModel, openai
from convoq.usage import Usage
from tests.support.openai_server import OpenAIServer, refusal_chunk, text_chunk, tool_call_chunk


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as running:
        yield running


@pytest.fixture
async def model(server: OpenAIServer) -> AsyncIterator[OpenAIChatModel]:
    chat = openai("gpt-x", base_url=server.url, api_key="k", retry_base_delay=0)
    yield chat
    await chat.aclose()


def ask(text: str = "hello") -> ModelRequest:
    return ModelRequest(messages=[Message.user(text)])


async def collect(model: OpenAIChatModel, request: ModelRequest) -> tuple[Message, list[str]]:
    deltas: list[str] = []

    async def on_delta(text: str) -> None:
        deltas.append(text)

    return await model.request(request, on_text_delta=on_delta), deltas


# -- n > 1 --------------------------------------------------------------------------------


async def test_streamed_choices_are_kept_apart_by_index(
    server: OpenAIServer, model: OpenAIChatModel
) -> None:
    call_of_choice_1 = tool_call_chunk(0, id="call_x", name="other", arguments='{"a":')
    call_of_choice_1["choices"][0]["index"] = 1
    chunks = [text_chunk("Hel"), text_chunk("Bon", index=1), call_of_choice_1,
              text_chunk("lo."), text_chunk("jour", index=1)]  # fmt: skip
    server.reply_stream(chunks)
    answer, deltas = await collect(model, ask())
    assert answer.text == "Hello."
    assert deltas == ["Hel", "lo."]
    assert answer.tool_calls == []


async def test_non_streamed_choice_zero_is_taken_by_index(
    server: OpenAIServer, model: OpenAIChatModel
) -> None:
    body = (
        '{"choices": [{"index": 1, "message": {"role": "assistant", "content": "second"},'
        ' "finish_reason": "stop"}, {"index": 0, "message": {"role": "assistant",'
        ' "content": "first"}, "finish_reason": "stop"}]}'
    )
    server.reply_raw(body)
    assert (await model.request(ask())).text == "first"


# -- refusals -----------------------------------------------------------------------------


async def test_streamed_refusal_is_a_refusal_not_an_empty_answer(
    server: OpenAIServer, model: OpenAIChatModel
) -> None:
    server.reply_stream([refusal_chunk("I can't "), refusal_chunk("help with that.")])
    answer, deltas = await collect(model, ask())
    assert answer.refusal == "I can't help with that."
    assert answer.text == ""
    assert deltas == []


async def test_non_streamed_refusal_is_kept_apart_from_content(
    server: OpenAIServer, model: OpenAIChatModel
) -> None:
    server.reply_message({"role": "assistant", "content": None, "refusal": "No."})
    answer = await model.request(ask())
    assert (answer.refusal, answer.text) == ("No.", "")


@pytest.mark.parametrize("streaming", [False, True])
async def test_agent_response_and_stored_turn_carry_the_refusal(
    server: OpenAIServer, model: OpenAIChatModel, streaming: bool
) -> None:
    memory = InMemoryConversationMemory()
    agent = Agent(model, memory=memory, conversation_id="c")
    server.reply_message({"role": "assistant", "content": None, "refusal": "Not that."})
    if streaming:
        events = [e async for e in agent.astream("do harm")]
        assert events[-2].type == "assistant"
        assert events[-2].data["refusal"] == "Not that."
        stored = await memory.aload("c")
    else:
        response = await agent.agenerate("do harm")
        assert (response.refusal, response.text, response.status) == ("Not that.", "", "completed")
        stored = await memory.aload("c")
    assert stored[-1].refusal == "Not that."
    # The refusal goes back to the model as the API gave it.
    server.reply_text("Fine.")
    await agent.agenerate("something else")
    sent = server.requests[-1].json["messages"]
    assert sent[1] == {"role": "assistant", "content": None, "refusal": "Not that."}


# -- deadlines ----------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [True, False])
async def test_keep_alive_comments_do_not_hold_a_call_past_its_attempt_deadline(
    server: OpenAIServer, streaming: bool
) -> None:
    server.reply_keepalive(every=0.2)
    chat = openai("gpt-x", base_url=server.url, api_key="k", attempt_timeout=1.0, max_retries=0)
    async with chat:
        with pytest.raises(ModelTimeoutError, match="attempt_timeout=1 s"):
            if streaming:
                await collect(chat, ask())
            else:
                await chat.request(ask())


async def test_a_silent_server_fails_within_the_deadline(server: OpenAIServer) -> None:
    server.reply_silent(60)
    chat = openai("gpt-x", base_url=server.url, api_key="k", timeout=60, attempt_timeout=1,
                  max_retries=0)  # fmt: skip
    async with chat:
        with pytest.raises(ModelTimeoutError):
            await collect(chat, ask())


async def test_total_deadline_ends_the_retries(server: OpenAIServer) -> None:
    for _ in range(10):
        server.reply_keepalive(every=0.2)
    chat = openai("gpt-x", base_url=server.url, api_key="k", attempt_timeout=0.5,
                  total_timeout=1.2, max_retries=9, retry_base_delay=0)  # fmt: skip
    async with chat:
        with pytest.raises(ModelTimeoutError, match=r"total_timeout=1\.2 s"):
            await chat.request(ask())
    # The total deadline, not max_retries (10 attempts), ended the retries.
    assert 1 <= len(server.requests) <= 4


async def test_without_deadlines_a_call_still_works(server: OpenAIServer) -> None:
    server.reply_text("ok")
    chat = openai("gpt-x", base_url=server.url, api_key="k", attempt_timeout=None,
                  total_timeout=None)  # fmt: skip
    async with chat:
        assert (await collect(chat, ask()))[0].text == "ok"


# -- finish_reason "length" ---------------------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True])
async def test_length_is_reported_on_the_response_and_the_stored_turn(
    server: OpenAIServer, model: OpenAIChatModel, streaming: bool
) -> None:
    memory = InMemoryConversationMemory()
    agent = Agent(model, memory=memory, conversation_id="c")
    server.reply_text("Once upon a", finish_reason="length")
    if streaming:
        events = [e async for e in agent.astream("tell a story")]
        assert events[-2].data["finish_reason"] == "length"
        assert events[-1].data["finish_reason"] == "length"  # "done" says it too
        assert events[-1].data["usage"]["total_tokens"] == 15
    else:
        response = await agent.agenerate("tell a story")
        assert (response.text, response.finish_reason) == ("Once upon a", "length")
    stored = await memory.aload("c")
    assert stored[-1].finish_reason == "length"


async def test_agent_told_to_fail_cut_off_answers_fails_and_stores_nothing(
    server: OpenAIServer, model: OpenAIChatModel
) -> None:
    memory = InMemoryConversationMemory()
    agent = Agent(model, memory=memory, conversation_id="c", fail_on_length=True)
    server.reply_text("Once upon a", finish_reason="length")
    with pytest.raises(TruncatedAnswerError, match="token limit") as caught:
        await agent.agenerate("tell a story")
    assert caught.value.details["finish_reason"] == "length"
    assert await memory.aload("c") == []
    server.reply_text("The end.")  # the conversation goes on
    assert (await agent.agenerate("again")).finish_reason == "stop"


async def test_length_without_any_answer_is_a_truncated_answer_error(
    server: OpenAIServer, model: OpenAIChatModel
) -> None:
    server.reply_message({"role": "assistant", "content": ""}, finish_reason="length")
    with pytest.raises(TruncatedAnswerError):
        await model.request(ask())


# -- retries like the official SDK --------------------------------------------------------


@pytest.mark.parametrize("status", [408, 409])
async def test_408_and_409_are_retried(
    server: OpenAIServer, model: OpenAIChatModel, status: int
) -> None:
    server.reply_status(status)
    server.reply_text("ok")
    assert (await model.request(ask())).text == "ok"
    assert len(server.requests) == 2


async def test_x_should_retry_false_stops_a_retryable_status(
    server: OpenAIServer, model: OpenAIChatModel
) -> None:
    server.reply_status(503, headers={"x-should-retry": "false"})
    server.reply_text("never sent")
    with pytest.raises(ModelHTTPError) as caught:
        await model.request(ask())
    assert caught.value.status_code == 503
    assert len(server.requests) == 1


async def test_x_should_retry_true_retries_any_status(
    server: OpenAIServer, model: OpenAIChatModel
) -> None:
    server.reply_status(400, headers={"X-Should-Retry": "true"})
    server.reply_text("ok")
    assert (await model.request(ask())).text == "ok"
    assert len(server.requests) == 2


async def test_a_plain_400_is_not_retried(server: OpenAIServer, model: OpenAIChatModel) -> None:
    server.reply_status(400)
    with pytest.raises(ModelHTTPError):
        await model.request(ask())
    assert len(server.requests) == 1


# -- usage --------------------------------------------------------------------------------

DETAILED = {
    "prompt_tokens": 120,
    "completion_tokens": 40,
    "total_tokens": 160,
    "prompt_tokens_details": {"cached_tokens": 64},
    "completion_tokens_details": {"reasoning_tokens": 16},
}


@pytest.mark.parametrize("streaming", [False, True])
async def test_usage_is_read_with_cached_and_reasoning_tokens(
    server: OpenAIServer, model: OpenAIChatModel, streaming: bool
) -> None:
    server.reply_text("Hi.", usage=DETAILED)
    answer = (await collect(model, ask()))[0] if streaming else await model.request(ask())
    expected = Usage(requests=1, prompt_tokens=120, completion_tokens=40, total_tokens=160,
                     cached_tokens=64, reasoning_tokens=16)  # fmt: skip
    assert answer.usage == expected
    assert answer.finish_reason == "stop"
    if streaming:
        assert server.requests[0].json["stream_options"] == {"include_usage": True}


async def test_agent_sums_usage_over_the_turns_model_calls(
    server: OpenAIServer, model: OpenAIChatModel
) -> None:
    from convoq import tool

    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        return "found"

    agent = Agent(model, tools=[lookup])
    server.reply_tool_call("lookup", {"q": "x"})  # default usage: 10 + 5
    server.reply_text("Done.", usage=DETAILED)
    response = await agent.agenerate("find x")
    expected = Usage(requests=2, prompt_tokens=130, completion_tokens=45, total_tokens=175,
                     cached_tokens=64, reasoning_tokens=16)  # fmt: skip
    assert response.usage == expected


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_server_reporting_no_usage_breaks_nothing(
    server: OpenAIServer, model: OpenAIChatModel, streaming: bool
) -> None:
    memory = InMemoryConversationMemory()
    agent = Agent(model, memory=memory, conversation_id="c")
    server.reply_text("Hi.", usage=None)
    if streaming:
        assert [e async for e in agent.astream("hello")][-1].data["status"] == "completed"
    else:
        response = await agent.agenerate("hello")
        assert response.usage == Usage(requests=1)
    assert (await memory.aload("c"))[-1].usage is None


# -- GenerationRequest --------------------------------------------------------------------


async def test_generation_request_ending_with_an_assistant_message_calls_the_model(
    server: OpenAIServer, model: OpenAIChatModel
) -> None:
    server.reply_text("Paris.")
    agent = Agent(model)
    given = [Message.user("Capital of France?"), Message.assistant("The capital is")]
    response = await agent.agenerate(GenerationRequest(messages=given))
    assert response.text == "Paris."
    assert len(server.requests) == 1
    sent = server.requests[0].json["messages"]
    assert sent[-1] == {"role": "assistant", "content": "The capital is"}
    assert response.turn[-1].role == MessageRole.ASSISTANT


def test_submit_refuses_a_generation_request_saying_why_and_what_to_use() -> None:
    request = GenerationRequest(messages=[Message.user("hi")])
    with pytest.raises(InvalidMessageError) as caught:
        build_submission("c", request, agent="a", known_agents=None, limits=Limits())  # type: ignore[arg-type]
    message = caught.value.message
    assert "bypasses memory" in message
    assert "Agent.generate(GenerationRequest" in message
    assert "expected" not in message
    assert caught.value.details["rule"] == "generation_request"


# -- a connection that drops mid-answer ---------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_connection_dropped_mid_answer_says_the_server_answered(
    server: OpenAIServer, streaming: bool
) -> None:
    chunk = '{"choices": [{"index": 0, "delta": {"content": "Hel"}}]}'
    body = f"data: {chunk}\n\n" * 3 if streaming else '{"choices": [{"message": {"content": "x"}}]}'
    content_type = "text/event-stream" if streaming else "application/json"
    server.reply_cut(body, cut_at=len(body) - 5, content_type=content_type)
    chat = openai("gpt-x", base_url=server.url, api_key="k", max_retries=0)
    async with chat:
        with pytest.raises(ModelError) as caught:
            await (collect(chat, ask()) if streaming else chat.request(ask()))
    message = caught.value.message
    assert "answered HTTP 200, then the connection dropped" in message
    assert "could not reach" not in message and "check base_url" not in message
    assert caught.value.details["answered_status"] == 200


async def test_a_dropped_answer_is_retried_when_nothing_was_streamed(server: OpenAIServer) -> None:
    body = '{"choices": [{"message": {"content": "x"}}]}'
    server.reply_cut(body, cut_at=10)
    server.reply_text("whole")
    chat = openai("gpt-x", base_url=server.url, api_key="k", max_retries=1, retry_base_delay=0)
    async with chat:
        assert (await chat.request(ask())).text == "whole"
    assert len(server.requests) == 2

"""Usage and finish reason per turn: on the Response in process, and through real worker
processes in the turn's result, its events, the stored turn and the conversation's sums."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import redis
from typer.testing import CliRunner

from convoq import Agent, ImagePart, Message, TextPart, ToolCall, tool
from convoq.cli import app
from convoq.client import AsyncClient, Client
from convoq.errors import TruncatedAnswerError
from convoq.memory import FileConversationMemory, RedisConversationMemory
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel
from convoq.redis.keys import KeySchema
from convoq.usage import Usage, counters_by_model, turn_tokens
from tests.support.worker_agents import ANSWER_USAGE, TOOL_CALL_USAGE, lookup, metered_fn
from tests.support.workers import WorkerPool, module_pool

TURN_USAGE = TOOL_CALL_USAGE + ANSWER_USAGE  # two model calls per "metered" turn

pool = module_pool(1)


def _cid() -> str:
    return f"usage-{uuid.uuid4().hex[:8]}"


# -- in process ---------------------------------------------------------------------------


async def test_response_sums_the_turns_calls_and_the_stored_turn_keeps_them(
    tmp_path: Path,
) -> None:
    memory = FileConversationMemory(tmp_path)
    agent = Agent(ScriptedModel(metered_fn), memory=memory, tools=[lookup])
    response = await agent.agenerate("look it up", conversation_id="c")
    assert response.usage == TURN_USAGE
    assert response.usage.requests == 2
    assert response.finish_reason == "stop"
    stored = await FileConversationMemory(tmp_path).aload("c")  # a fresh reader
    assert [m.usage for m in stored if m.role == MessageRole.ASSISTANT] == [
        TOOL_CALL_USAGE,
        ANSWER_USAGE,
    ]
    # What the turn added after its user message, as the model counted it: the growth of
    # the prompt between its first and last call, plus the final answer less reasoning.
    assert turn_tokens(stored) == (130 - 100) + (20 - 5)


async def test_usage_before_an_approval_counts_after_the_resume() -> None:
    @tool(requires_approval=True)
    def pay(amount: int) -> str:
        """Pay."""
        return "paid"

    def model_fn(request: ModelRequest) -> Message:
        if request.messages[-1].role == MessageRole.TOOL:
            return Message.assistant("done", usage=ANSWER_USAGE)
        call = ToolCall(id="call-1", name="pay", arguments={"amount": 3})
        return Message.assistant("", [call], usage=TOOL_CALL_USAGE)

    agent = Agent(ScriptedModel(model_fn), tools=[pay])
    parked = await agent.agenerate("pay 3")
    assert parked.status == "awaiting_approval"
    assert parked.usage == TOOL_CALL_USAGE
    assert parked.continuation is not None
    resumed = await agent.aresume(parked.continuation.model_dump_json(), {"call-1": True})
    assert resumed.usage == TURN_USAGE


async def test_a_model_reporting_no_usage_counts_its_calls_only() -> None:
    agent = Agent(ScriptedModel.from_replies(["hi"]))
    response = await agent.agenerate("hello")
    assert response.usage == Usage(requests=1)
    assert response.finish_reason is None


async def test_redis_elements_carry_the_turns_token_count(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    image = ImagePart(data=b"\x89PNG" + b"\x00" * 40, mime_type="image/png")
    metered = Agent(ScriptedModel(metered_fn), memory=memory, tools=[lookup])
    try:
        await metered.agenerate(Message(content=[TextPart(text="see"), image]), conversation_id="c")
        await Agent(ScriptedModel.from_replies(["hi"]), memory=memory).agenerate(
            "plain", conversation_id="c"
        )
        first, second = redis_client.lrange(KeySchema(key_prefix).turns("c"), 0, -1)
        sha = hashlib.sha256(image.data).hexdigest().encode()
        assert first.startswith(b"T t=45 b=" + sha + b" w=")  # 45 = turn_tokens(the turn)
        assert second.startswith(b"T w=")  # no usage reported: no count
        async with AsyncClient(redis_url, prefix=key_prefix) as aclient:
            # Turns stored in process count in the conversation's sums too.
            assert await aclient.usage("c") == TURN_USAGE + Usage(requests=1)
        stored = await memory.aload("c", last_turns=2)
        assert stored[0].attachments == [image]
        assert [m.usage for m in stored if m.role == MessageRole.ASSISTANT][:2] == [
            TOOL_CALL_USAGE,
            ANSWER_USAGE,
        ]
    finally:
        await memory.aclose()


async def test_each_answer_names_its_model_and_the_conversation_sums_usage_per_model(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    first = Agent(ScriptedModel(metered_fn, name="model-a"), memory=memory, tools=[lookup])
    second = Agent(ScriptedModel(metered_fn, name="vendor:model-b"), memory=memory, tools=[lookup])
    try:
        await first.agenerate("one", conversation_id="c")
        await second.agenerate("two", conversation_id="c")
        await second.agenerate("three", conversation_id="c")
        stored = await memory.aload("c")
        answers = [m.model for m in stored if m.role == MessageRole.ASSISTANT]
        assert answers == ["model-a"] * 2 + ["vendor:model-b"] * 4
        assert all(m.model is None for m in stored if m.role != MessageRole.ASSISTANT)
        meta = redis_client.hgetall(KeySchema(key_prefix).meta("c"))
        # A model name with a colon in it keeps it: the field is what follows the last one.
        assert counters_by_model(meta) == {
            "model-a": TURN_USAGE,
            "vendor:model-b": TURN_USAGE + TURN_USAGE,
        }
    finally:
        await memory.aclose()


# -- through workers ----------------------------------------------------------------------


def test_worker_turn_result_events_and_history_carry_usage(client: Client) -> None:
    cid = _cid()
    handle = client.submit(cid, "look it up", agent="metered")
    result = handle.wait(timeout=30)
    assert (result.usage, result.finish_reason) == (TURN_USAGE, "stop")
    assert result.turn[-1].usage == ANSWER_USAGE  # the stored turn as the record has it
    assistant = [e.data for e in handle.events(timeout=10) if e.type == "assistant"]
    assert [e["usage"] for e in assistant] == [
        TOOL_CALL_USAGE.model_dump(),
        ANSWER_USAGE.model_dump(),
    ]
    assert [e["finish_reason"] for e in assistant] == ["tool_calls", "stop"]
    stored = client.history(cid)
    assert [m.usage for m in stored if m.role == MessageRole.ASSISTANT] == [
        TOOL_CALL_USAGE,
        ANSWER_USAGE,
    ]
    r = redis.Redis.from_url(client.redis_url)
    try:  # the committed element carries the turn's token count for windows
        assert r.lindex(KeySchema(client.async_client.settings.prefix).turns(cid), 0).startswith(
            b"T t=45 w="
        )
    finally:
        r.close()


def test_conversation_usage_sums_its_turns(client: Client) -> None:
    cid = _cid()
    assert client.usage(cid) == Usage()
    for text in ("one", "two"):
        client.submit(cid, text, agent="metered").wait(timeout=30)
    client.submit(cid, "three", agent="echo").wait(timeout=30)  # reports no usage
    assert client.usage(cid) == TURN_USAGE + TURN_USAGE + Usage(requests=1)
    r = redis.Redis.from_url(client.redis_url)
    try:  # a worker's commit sums per model too (a model reporting nothing counts nowhere)
        meta = r.hgetall(KeySchema(client.async_client.settings.prefix).meta(cid))
        assert counters_by_model(meta) == {"scripted": TURN_USAGE + TURN_USAGE}
    finally:
        r.close()


async def test_async_client_usage(pool: WorkerPool) -> None:
    cid = _cid()
    async with AsyncClient(pool.redis_url, prefix=pool.prefix, partitions=pool.partitions,
                           broker_url=pool.env.get("CONVOQ_BROKER_URL")) as aclient:  # fmt: skip
        handle = await aclient.submit(cid, "look it up", agent="metered")
        await handle.wait(timeout=30)
        assert await aclient.usage(cid) == TURN_USAGE


def test_cut_off_answers_are_reported_or_failed_as_the_profile_says(client: Client) -> None:
    cid = _cid()
    kept = client.submit(cid, "story", agent="cut_off").wait(timeout=30)
    assert (kept.text, kept.finish_reason) == ("Once upon a", "length")
    failed = client.submit(cid, "story", agent="strict_cut_off").wait(
        timeout=30, raise_on_error=False
    )
    assert failed.status == "failed"
    assert isinstance(failed.error, TruncatedAnswerError)
    assert len(client.history(cid)) == 2  # only the kept turn was stored
    assert client.usage(cid) == ANSWER_USAGE  # and only it was counted


def test_a_refusal_is_a_succeeded_turn_that_says_so(client: Client) -> None:
    cid = _cid()
    result = client.submit(cid, "do harm", agent="refuser").wait(timeout=30)
    assert (result.status, result.text, result.refusal) == (
        "succeeded",
        "",
        "I can't help with that.",
    )
    assert client.history(cid)[-1].refusal == "I can't help with that."


def test_history_usage_on_the_command_line(client: Client, pool: WorkerPool) -> None:
    cid = _cid()
    client.submit(cid, "look it up", agent="metered").wait(timeout=30)
    result = CliRunner().invoke(app, ["history", cid, "--usage"], env=pool.env)
    assert result.exit_code == 0, result.output
    cells = " ".join(result.output.replace("│", " ").split())  # the table may wrap cells
    assert "130 prompt + 20" in cells and "100 prompt + 10" in cells
    assert "usage: 2 model calls, 230 prompt + 30 completion = 260 tokens" in result.output
    assert "(64 cached, 5 reasoning)" in result.output

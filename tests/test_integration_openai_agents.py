"""convoq memory as the OpenAI Agents SDK's session (convoq.integrations.openai_agents),
on every backend, with the SDK's own ScriptedModel and a real redis-server."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from agents import Agent, RunConfig, Runner, function_tool
from agents.memory import Session, SessionSettings
from agents.testing import ScriptedModel, assistant_message, function_call

from convoq.client import AsyncClient
from convoq.errors import (
    ConversationBusyError,
    ConvoqError,
    CorruptDataError,
    InvalidMessageError,
)
from convoq.integrations._originals import ORIGINAL_MIME_TYPE
from convoq.integrations.openai_agents import ConvoqSession
from convoq.memory import (
    ConversationMemory,
    InMemoryConversationMemory,
    StoredConversationMemory,
)
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import FilePart, ImagePart, Message, MessageRole, TextPart, ToolCall
from convoq.redis.keys import KeySchema
from convoq.summary import Summary
from convoq.window import Window
from tests.support.memory_backends import backend_url, close_memory, make_memory

ROOT = Path(__file__).resolve().parents[1]
RUN_DRIVER = ROOT / "tests" / "support" / "agents_session_run.py"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
PDF = b"%PDF-1.7\n" + bytes(range(255, -1, -1)) * 3
NO_TRACING = RunConfig(tracing_disabled=True)


def url_of(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@pytest.fixture(params=["in_memory", "file", "redis"])
def memory(
    request: pytest.FixtureRequest, tmp_path: Path, key_prefix: str
) -> Iterator[ConversationMemory]:
    made = make_memory(request.param, tmp_path, backend_url(request, request.param), key_prefix)
    yield made
    close_memory(made)


def every_kind_of_item() -> list[dict[str, Any]]:
    """Items as the SDK saves them (ids, statuses, annotations), as users write them, and
    types convoq has no counterpart for."""
    return [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": "What is in this picture and this file?"},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": url_of("image/png", PNG), "detail": "low"},
                {
                    "type": "input_file",
                    "file_data": url_of("application/pdf", PDF),
                    "filename": "report.pdf",
                },
                {
                    "type": "input_image",
                    "image_url": "https://example.com/cat.png",
                    "detail": "auto",
                },
            ],
        },
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}]},
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "lookup",
            "arguments": '{"q":"cat","n":2}',
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "a tabby cat"},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "Un chat.", "annotations": [], "logprobs": []}
            ],
        },
        {
            "type": "web_search_call",
            "id": "ws_1",
            "status": "completed",
            "action": {"type": "search", "query": "cats"},
        },
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": [
                {"type": "input_text", "text": "ok"},
                {"type": "input_image", "image_url": url_of("image/png", PNG), "detail": "auto"},
            ],
        },
        {"role": "user", "content": 'Merci, unicode ✓ \u00e9 and "quotes"'},
        {"role": "user", "content": ""},
        {"role": "user", "content": []},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot."}]},
    ]


async def test_items_come_back_exactly_as_added(memory: ConversationMemory) -> None:
    items = every_kind_of_item()
    await ConvoqSession("chat-1", memory).add_items(items[:3])
    await ConvoqSession("chat-1", memory).add_items(items[3:])
    assert await ConvoqSession("chat-1", memory).get_items() == items
    # One stored message per item, oldest first.
    assert len(await memory.aload("chat-1")) == len(items)


async def test_items_are_stored_as_convoq_messages(memory: ConversationMemory) -> None:
    items = every_kind_of_item()
    await ConvoqSession("chat-1", memory).add_items(items)
    stored = await memory.aload("chat-1")
    roles = [m.role for m in stored]
    assert roles == [
        MessageRole.DEVELOPER,
        MessageRole.USER,
        MessageRole.USER,
        MessageRole.ASSISTANT,
        MessageRole.ASSISTANT,
        MessageRole.TOOL,
        MessageRole.ASSISTANT,
        MessageRole.ASSISTANT,
        MessageRole.TOOL,
        MessageRole.USER,
        MessageRole.USER,
        MessageRole.USER,
        MessageRole.ASSISTANT,
    ]
    # Plain items are stored as plain messages: nothing kept beside them.
    assert stored[0] == Message(
        role=MessageRole.DEVELOPER, content=[TextPart(text="Answer in French.")]
    )
    assert stored[5] == Message(
        role=MessageRole.TOOL, content=[TextPart(text="a tabby cat")], tool_call_id="call_1"
    )
    picture = stored[2]
    assert [type(p) for p in picture.content] == [TextPart, ImagePart, FilePart, FilePart]
    image, pdf, original = picture.content[1:]
    assert isinstance(image, ImagePart) and image.data == PNG and image.mime_type == "image/png"
    assert image.provider_options == {"detail": "low"}
    assert isinstance(pdf, FilePart) and pdf.data == PDF and pdf.filename == "report.pdf"
    assert isinstance(original, FilePart) and original.mime_type == ORIGINAL_MIME_TYPE
    # The kept original does not hold the attachment bytes a second time.
    assert base64.b64encode(PNG).decode()[:40] not in original.data.decode()
    assert stored[4].tool_calls == [
        ToolCall(id="call_1", name="lookup", arguments={"q": "cat", "n": 2})
    ]
    assert stored[6].text == "Un chat."


async def test_get_items_with_a_limit_reads_only_that_many_turns(tmp_path: Path) -> None:
    asked: list[Window] = []

    class Watched(InMemoryConversationMemory):
        async def _read(self, conversation_id: str, window: Window) -> list[Message]:
            asked.append(window)
            return await super()._read(conversation_id, window)

    memory = Watched()
    items = every_kind_of_item()
    session = ConvoqSession("chat-1", memory)
    await session.add_items(items)
    for limit in range(1, len(items) + 2):
        asked.clear()
        assert await session.get_items(limit) == items[-limit:]
        assert [w.keep_last_turns for w in asked] == [limit]
    assert await session.get_items(0) == []
    limited = ConvoqSession("chat-1", memory, session_settings=SessionSettings(limit=2))
    assert await limited.get_items() == items[-2:]
    assert await limited.get_items(3) == items[-3:]


async def test_pop_item_removes_and_returns_the_newest(memory: ConversationMemory) -> None:
    items = every_kind_of_item()
    session = ConvoqSession("chat-1", memory)
    await session.add_items(items)
    assert await session.pop_item() == items[-1]
    assert await session.pop_item() == items[-2]
    assert await session.get_items() == items[:-2]
    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None


async def test_a_turn_convoq_wrote_reads_as_items(memory: ConversationMemory) -> None:
    call = ToolCall(id="call_9", name="lookup", arguments={"q": "x"})
    memory.append(
        "chat-1",
        [
            Message.user("hi"),
            Message.assistant("Let me look.", [call]),
            Message.tool_result(call, "found"),
        ],
    )
    session = ConvoqSession("chat-1", memory)
    assert await session.get_items() == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Let me look."},
        {"type": "function_call", "call_id": "call_9", "name": "lookup", "arguments": '{"q": "x"}'},
        {"type": "function_call_output", "call_id": "call_9", "output": "found"},
    ]
    await session.pop_item()
    popped = await session.pop_item()
    assert popped == {
        "type": "function_call",
        "call_id": "call_9",
        "name": "lookup",
        "arguments": '{"q": "x"}',
    }
    assert await session.get_items() == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Let me look."},
    ]


@pytest.mark.parametrize(
    "bad",
    [
        ["not an item"],
        [{"role": "user", "content": b"bytes are not JSON"}],
        [{"role": "user", "content": ("a", "tuple")}],
        [{"role": "user", "content": float("nan")}],
        [{1: "a key that is not a string"}],
    ],
)
async def test_bad_items_are_refused_and_nothing_is_written(
    memory: ConversationMemory, bad: list[Any]
) -> None:
    session = ConvoqSession("chat-1", memory)
    await session.add_items([{"role": "user", "content": "kept"}])
    with pytest.raises(InvalidMessageError):
        await session.add_items([{"role": "user", "content": "first of the batch"}, *bad])
    assert await session.get_items() == [{"role": "user", "content": "kept"}]


def test_bad_arguments_are_refused() -> None:
    memory = InMemoryConversationMemory()
    with pytest.raises(ConvoqError, match="conversation id"):
        ConvoqSession("", memory)
    with pytest.raises(ConvoqError, match="busy_timeout_s"):
        ConvoqSession("chat-1", memory, busy_timeout_s=-1)
    with pytest.raises(ConvoqError, match="limit"):
        asyncio.run(ConvoqSession("chat-1", memory).get_items("3"))  # type: ignore[arg-type]


def test_it_is_the_sdks_session() -> None:
    assert isinstance(ConvoqSession("chat-1", InMemoryConversationMemory()), Session)


async def test_attachments_are_stored_once_per_conversation_on_redis(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    image = {"type": "input_image", "image_url": url_of("image/png", PNG), "detail": "low"}
    try:
        session = ConvoqSession("chat-1", memory)
        for n in range(3):
            await session.add_items(
                [
                    {"role": "user", "content": [image]},
                    {"role": "assistant", "content": f"seen {n}"},
                ]
            )
        blobs = redis_client.hgetall(KeySchema(key_prefix).blobs("chat-1"))
        assert list(blobs.values()) == [PNG]
        assert len(await session.get_items()) == 6
    finally:
        await memory.aclose()


async def test_a_running_convoq_turn_keeps_writes_out(redis_url: str, key_prefix: str) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    other = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        # Another process's turn (an Agent, a worker) holds the conversation's lease.
        await other.areserve("chat-1", "a-running-turn")
        session = ConvoqSession("chat-1", memory, busy_timeout_s=0)
        with pytest.raises(ConversationBusyError):
            await session.add_items([{"role": "user", "content": "too early"}])
        with pytest.raises(ConversationBusyError):
            await session.pop_item()
        await other.acommit_turn("chat-1", "a-running-turn", [Message.user("the turn")])
        await session.add_items([{"role": "user", "content": "after it"}])
        assert await session.get_items() == [
            {"role": "user", "content": "the turn"},
            {"role": "user", "content": "after it"},
        ]
    finally:
        await memory.aclose()
        await other.aclose()


async def test_retention_applies_to_session_writes(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix, conversation_ttl_s=3600)
    try:
        await ConvoqSession("chat-1", memory).add_items([{"role": "user", "content": "hi"}])
        ttl = redis_client.pttl(KeySchema(key_prefix).turns("chat-1"))
        assert 0 < ttl <= 3_600_000
    finally:
        await memory.aclose()


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


async def test_runner_run_keeps_the_conversation_in_convoq(memory: ConversationMemory) -> None:
    model = ScriptedModel(
        [
            [function_call("weather", {"city": "Paris"}, call_id="call_1")],
            [assistant_message("It is sunny in Paris.", item_id="msg_1")],
            [assistant_message("You asked about Paris.", item_id="msg_2")],
        ]
    )
    agent = Agent(name="assistant", model=model, tools=[weather])
    first = await Runner.run(
        agent, "Weather in Paris?", session=ConvoqSession("c", memory), run_config=NO_TRACING
    )
    assert first.final_output == "It is sunny in Paris."
    second = await Runner.run(
        agent, "What did I ask?", session=ConvoqSession("c", memory), run_config=NO_TRACING
    )
    assert second.final_output == "You asked about Paris."
    call = model.last_call
    assert call is not None
    sent = call.input
    assert isinstance(sent, list)
    stored = await ConvoqSession("c", memory).get_items()
    # The second run sent the whole stored first run, then its own input.
    assert sent == stored[:-1]
    assert [i.get("type", "message") for i in stored] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
        "message",
        "message",
    ]
    assert stored[2]["output"] == "sunny in Paris"
    assert [m.role for m in await memory.aload("c")] == [
        MessageRole.USER,
        MessageRole.ASSISTANT,
        MessageRole.TOOL,
        MessageRole.ASSISTANT,
        MessageRole.USER,
        MessageRole.ASSISTANT,
    ]


def run_in_process(redis_url: str, prefix: str, text: str, answer: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOQ_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, str(RUN_DRIVER), redis_url, prefix, "chat-x", text, answer],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_runner_run_across_two_processes_on_one_redis(redis_url: str, key_prefix: str) -> None:
    first = run_in_process(redis_url, key_prefix, "My name is Ada.", "Hello Ada.")
    assert first["output"] == "Hello Ada."
    assert first["sent"] == [{"role": "user", "content": "My name is Ada."}]
    second = run_in_process(redis_url, key_prefix, "What is my name?", "Ada.")
    assert second["output"] == "Ada."
    # The second process's model was sent the first process's turn, read from Redis.
    assert [i.get("content") for i in second["sent"][::2]] == [
        "My name is Ada.",
        "What is my name?",
    ]
    assert second["sent"][1]["content"][0]["text"] == "Hello Ada."
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        stored = memory.load("chat-x")
        assert [m.text for m in stored] == [
            "My name is Ada.",
            "Hello Ada.",
            "What is my name?",
            "Ada.",
        ]
    finally:
        memory.close()


def run_sync_on_a_loop_of_its_own(agent: Agent[Any], text: str, session: ConvoqSession) -> Any:
    """``Runner.run_sync`` as a script calls it, on a thread whose loop is closed after."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return Runner.run_sync(agent, text, session=session, run_config=NO_TRACING)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


async def run_agent(how: str, agent: Agent[Any], text: str, session: ConvoqSession) -> Any:
    """``Runner.run``, ``Runner.run_sync`` (on a thread of its own) or ``run_streamed``."""
    if how == "run":
        return await Runner.run(agent, text, session=session, run_config=NO_TRACING)
    if how == "run_sync":
        return await asyncio.to_thread(run_sync_on_a_loop_of_its_own, agent, text, session)
    streamed = Runner.run_streamed(agent, text, session=session, run_config=NO_TRACING)
    async for _event in streamed.stream_events():
        pass
    return streamed


@pytest.mark.parametrize("how", ["run", "run_sync", "run_streamed"])
async def test_every_runner_entry_point_keeps_sessions_apart(
    memory: ConversationMemory, how: str
) -> None:
    model = ScriptedModel([
        [assistant_message("Cats, noted.")],
        [assistant_message("Dogs, noted.")],
        [assistant_message("You like cats.")],
    ])  # fmt: skip
    agent = Agent(name="assistant", model=model)
    cats, dogs = ConvoqSession("cats", memory), ConvoqSession("dogs", memory)
    assert (await run_agent(how, agent, "I like cats.", cats)).final_output == "Cats, noted."
    assert (await run_agent(how, agent, "I like dogs.", dogs)).final_output == "Dogs, noted."
    result = await run_agent(how, agent, "What do I like?", ConvoqSession("cats", memory))
    assert result.final_output == "You like cats."
    call = model.last_call
    assert call is not None and isinstance(call.input, list)
    assert [item.get("role") for item in call.input] == ["user", "assistant", "user"]
    assert "dogs" not in json.dumps(call.input)
    assert len(await dogs.get_items()) == 2


WRITES_DRIVER = ROOT / "tests" / "support" / "agents_session_writes.py"


def test_two_processes_writing_one_session_interleave_whole_batches(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOQ_")}
    env["PYTHONPATH"] = str(ROOT)
    writers = [
        subprocess.Popen(
            [
                sys.executable,
                str(WRITES_DRIVER),
                redis_url,
                key_prefix,
                "shared",
                tag,
                "15",
                str(go),
            ],
            env=env,
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("a", "b")
    ]
    go.touch()
    for writer in writers:
        _, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err[-3000:]
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        items = asyncio.run(ConvoqSession("shared", memory).get_items())
    finally:
        memory.close()
    assert len(items) == 60
    # Every batch is stored whole: a user item is always followed by its own answer.
    for asked, answered in zip(items[::2], items[1::2], strict=True):
        assert answered == {"role": "assistant", "content": f"{asked['content']} answered"}
    for tag in ("a", "b"):
        mine = [i["content"] for i in items[::2] if i["content"].startswith(f"{tag}-")]
        assert mine == [f"{tag}-{n}" for n in range(15)]


def test_without_a_memory_it_uses_redis_from_the_settings(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVOQ_REDIS_URL", redis_url)
    monkeypatch.setenv("CONVOQ_PREFIX", key_prefix)
    session = ConvoqSession("chat-1")
    asyncio.run(session.add_items([{"role": "user", "content": "hi"}]))
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        assert memory.load("chat-1") == [Message.user("hi")]
    finally:
        memory.close()
        assert isinstance(session.memory, RedisConversationMemory)
        session.memory.close()


async def test_clear_session_is_refused_while_a_turn_runs(redis_url: str, key_prefix: str) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        session = ConvoqSession("chat-1", memory)
        await session.add_items([{"role": "user", "content": "kept"}])
        await memory.areserve("chat-1", "a-running-turn")
        with pytest.raises(ConversationBusyError):
            await session.clear_session()
        await memory.arelease("chat-1", "a-running-turn")
        assert await session.get_items() == [{"role": "user", "content": "kept"}]
        await session.clear_session()
        assert await session.get_items() == []
    finally:
        await memory.aclose()


async def test_a_damaged_original_is_reported() -> None:
    memory = InMemoryConversationMemory()
    session = ConvoqSession("chat-1", memory)
    await session.add_items([{"type": "reasoning", "id": "rs_1", "summary": []}])
    [stored] = memory.load("chat-1")
    original = stored.content[-1]
    assert isinstance(original, FilePart)
    for damaged in (b"not json", original.data.replace(b'"version":1', b'"version":2')):
        memory.clear("chat-1")
        broken = FilePart(data=damaged, mime_type=ORIGINAL_MIME_TYPE)
        memory.append("chat-1", [stored.model_copy(update={"content": [broken]})])
        with pytest.raises(CorruptDataError):
            await session.get_items()


async def test_pop_item_rewrites_the_conversation_and_drops_its_summary(
    memory: ConversationMemory,
) -> None:
    assert isinstance(memory, StoredConversationMemory)
    session = ConvoqSession("chat-1", memory)
    for n in range(3):
        await session.add_items(
            [{"role": "user", "content": f"q{n}"}, {"role": "assistant", "content": f"a{n}"}]
        )
    _, _, basis = await memory.asummary_state("chat-1")
    await memory.acommit_summary("chat-1", Summary.of("q0 and q1", watermark=2, version=1), basis)
    assert await memory.asummary("chat-1") is not None
    assert await session.pop_item() == {"role": "assistant", "content": "a2"}
    assert await memory.asummary("chat-1") is None
    assert [i["content"] for i in await session.get_items()] == ["q0", "a0", "q1", "a1", "q2"]


async def test_a_queued_worker_turn_keeps_writes_and_pops_out(
    redis_url: str, key_prefix: str
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    session = ConvoqSession("chat-1", memory, busy_timeout_s=0)
    try:
        await session.add_items([{"role": "user", "content": "kept"}])
        # No worker runs: the submitted turn stays queued in the conversation's inbox.
        async with AsyncClient(redis_url, prefix=key_prefix, agents=["echo"]) as client:
            handle = await client.submit("chat-1", "a queued turn", agent="echo")
            assert await handle.status() == "queued"
            for write in (
                session.add_items([{"role": "user", "content": "too early"}]),
                session.pop_item(),
                session.clear_session(),
            ):
                with pytest.raises(ConversationBusyError):
                    await write
            await client.cancel(handle)
        assert await session.get_items() == [{"role": "user", "content": "kept"}]
    finally:
        await memory.aclose()


async def test_a_refused_write_stores_nothing_and_frees_the_conversation(
    redis_url: str, key_prefix: str
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix, max_turn_bytes=4096)
    try:
        session = ConvoqSession("chat-1", memory, busy_timeout_s=0)
        await session.add_items([{"role": "user", "content": "kept"}])
        with pytest.raises(InvalidMessageError):
            await session.add_items([{"role": "user", "content": "x" * 10_000}])
        # The refused write held the conversation's lease; it is free again at once.
        await session.add_items([{"role": "assistant", "content": "next"}])
        assert await session.get_items() == [
            {"role": "user", "content": "kept"},
            {"role": "assistant", "content": "next"},
        ]
    finally:
        await memory.aclose()

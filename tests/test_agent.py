"""The in-process Agent: memory round trips, whole turns stored once, windows, busy."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from convoq import Agent, FilePart, GenerationRequest, ImagePart, Message, TextPart, ToolCall, tool
from convoq.errors import (
    ConversationBusyError,
    ConversationMemoryError,
    InvalidConversationIdError,
    InvalidMessageError,
    ModelError,
)
from convoq.memory import ConversationMemory, InMemoryConversationMemory
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel
from tests.support.memory_backends import BACKENDS, backend_url, make_memory
from tests.support.models import echo_history

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
PDF = b"%PDF-1.7\n" + bytes(reversed(range(256))) * 4


@pytest.fixture(params=BACKENDS)
def memory(request: pytest.FixtureRequest, tmp_path: Path, key_prefix: str) -> ConversationMemory:
    url = backend_url(request, request.param)
    return make_memory(request.param, tmp_path, url, key_prefix)


def test_second_turn_sees_the_first(memory: ConversationMemory) -> None:
    agent = Agent(ScriptedModel(echo_history), memory=memory, conversation_id="user-42")
    agent.generate("My name is Ada.")
    r = agent.generate("What is my name?")
    assert r.text == "My name is Ada. | What is my name?"
    assert [m.role for m in memory.load("user-42")] == ["user", "assistant"] * 2


def test_without_conversation_id_nothing_is_loaded_or_stored() -> None:
    memory = InMemoryConversationMemory()
    memory.append("other", [Message.user("old")])
    agent = Agent(ScriptedModel(echo_history), memory=memory)
    assert agent.generate("one").text == "one"
    assert agent.generate("two").text == "two"
    assert memory.load("other") == [Message.user("old")]


def test_generation_request_bypasses_memory() -> None:
    memory = InMemoryConversationMemory()
    memory.append("c1", [Message.user("stored")])
    model = ScriptedModel(echo_history)
    agent = Agent(model, memory=memory, conversation_id="c1", instructions="Be brief.")
    r = agent.generate(GenerationRequest(messages=[Message.user("a"), Message.user("b")]))
    assert r.text == "a | b"
    sent = model.calls[0].messages
    assert sent[0].role == MessageRole.SYSTEM and sent[0].text == "Be brief."
    assert [m.text for m in sent[1:]] == ["a", "b"]
    assert memory.load("c1") == [Message.user("stored")]


def test_model_receives_instructions_history_and_message_exactly() -> None:
    memory = InMemoryConversationMemory()
    model = ScriptedModel(lambda req: "ok")
    agent = Agent(model, instructions="You are concise.", memory=memory, conversation_id="c")
    agent.generate("first")
    agent.generate("second")
    sent = model.calls[1].messages
    assert [(m.role.value, m.text) for m in sent] == [
        ("system", "You are concise."), ("user", "first"), ("assistant", "ok"), ("user", "second"),
    ]  # fmt: skip
    assert all(m.role != MessageRole.SYSTEM for m in memory.load("c"))


def test_whole_turn_with_tools_is_appended_in_order(memory: ConversationMemory) -> None:
    calls = iter(
        [
            Message(role="assistant", content=[TextPart(text="checking")], tool_calls=[
                ToolCall(id="c1", name="add", arguments={"a": 1, "b": 2}),
                ToolCall(id="c2", name="add", arguments={"a": 3, "b": 4}),
            ]),
            "1+2=3 and 3+4=7",
        ]
    )  # fmt: skip

    def add(a: int, b: int) -> int:
        return a + b

    agent = Agent(ScriptedModel(lambda req: next(calls)), memory=memory, tools=[add])
    image = ImagePart(data=PNG, mime_type="image/png", provider_options={"detail": "low"})
    pdf = FilePart(data=PDF, mime_type="application/pdf", filename="r.pdf")
    user = Message(content=[TextPart(text="Compare"), image, pdf])
    r = agent.generate(user, conversation_id="t1")
    stored = memory.load("t1")
    assert stored == r.turn
    assert [m.role.value for m in stored] == ["user", "assistant", "tool", "tool", "assistant"]
    assert stored[0] == user and stored[0].content[1].data == PNG  # type: ignore[union-attr]
    assert [(m.tool_call_id, m.text) for m in stored[2:4]] == [("c1", "3"), ("c2", "7")]
    assert stored[-1].text == "1+2=3 and 3+4=7"


def test_failed_model_call_stores_nothing(memory: ConversationMemory) -> None:
    agent = Agent(ScriptedModel.from_replies([]), memory=memory, conversation_id="f")
    with pytest.raises(ModelError, match="ran out"):
        agent.generate("hello")
    assert memory.load("f") == []
    # The conversation is free again after the failure.
    agent.model = ScriptedModel(lambda req: "fine")
    assert agent.generate("again").text == "fine"


class FailingAppend(InMemoryConversationMemory):
    async def _write(self, conversation_id: str, messages: list[Message]) -> None:
        raise OSError("disk full")


def test_append_failure_keeps_the_answer() -> None:
    agent = Agent(ScriptedModel(lambda req: "the answer"), memory=FailingAppend(),
                  conversation_id="x")  # fmt: skip
    with pytest.raises(ConversationMemoryError, match="storing the turn failed") as info:
        agent.generate("q")
    assert info.value.response.text == "the answer"
    assert info.value.response.turn[0].text == "q"


def test_attachments_reach_the_model_and_survive_a_restart(tmp_path: Path) -> None:
    from convoq.memory import FileConversationMemory

    png_file, pdf_file = tmp_path / "c.png", tmp_path / "r.pdf"
    png_file.write_bytes(PNG)
    pdf_file.write_bytes(PDF)
    from convoq import load_image, load_pdf

    model = ScriptedModel(lambda req: "seen")
    store = tmp_path / "store"
    agent = Agent(model, memory=FileConversationMemory(store), conversation_id="att")
    agent.generate(
        Message(content=[TextPart(text="Compare"), load_image(png_file), load_pdf(pdf_file)])
    )
    png_file.unlink()
    pdf_file.unlink()
    model2 = ScriptedModel(lambda req: "remembered")
    agent2 = Agent(model2, memory=FileConversationMemory(store), conversation_id="att")
    agent2.generate("What did I send?")
    first = model2.calls[0].messages[0]
    assert [type(p).__name__ for p in first.content] == ["TextPart", "ImagePart", "FilePart"]
    assert first.content[1].data == PNG and first.content[1].mime_type == "image/png"  # type: ignore[union-attr]
    assert first.content[2].data == PDF and first.content[2].filename == "r.pdf"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("message", "rule"),
    [
        (Message(role="assistant", content=[TextPart(text="x")]), "role 'user'"),
        (Message(content=[]), "at least one part"),
        (Message(content=[TextPart(text="x")], tool_calls=[ToolCall(id="1", name="t")]),
         "tool calls"),
        (Message(content=[TextPart(text="x")], tool_call_id="1"), "tool_call_id"),
        ("", "at least one part"),
    ],
)  # fmt: skip
def test_invalid_single_message_is_refused_before_any_io(message: object, rule: str) -> None:
    class Untouchable(ConversationMemory):
        def load(self, conversation_id: str, *, last_turns: int | None = None) -> list[Message]:
            raise AssertionError("memory was read")

        def append(self, conversation_id: str, messages: list[Message]) -> None:
            raise AssertionError("memory was written")

    model = ScriptedModel(lambda req: pytest.fail("model was called"))
    agent = Agent(model, memory=Untouchable(), conversation_id="c")
    with pytest.raises(InvalidMessageError, match=rule):
        agent.generate(message)  # type: ignore[arg-type]


def test_invalid_conversation_id_is_refused() -> None:
    agent = Agent(ScriptedModel(lambda req: "x"), memory=InMemoryConversationMemory())
    with pytest.raises(InvalidConversationIdError):
        agent.generate("hi", conversation_id="new\nline")
    with pytest.raises(InvalidConversationIdError):
        Agent(ScriptedModel(lambda req: "x"), conversation_id="")


def test_keep_last_turns_sends_whole_recent_turns_and_storage_keeps_all(
    memory: ConversationMemory,
) -> None:
    memory.append("w", [Message.system("rules")])
    model = ScriptedModel(lambda req: "ok")
    agent = Agent(model, memory=memory, conversation_id="w", keep_last_turns=2)
    for i in range(5):
        agent.generate(f"turn {i}")
    sent = model.calls[-1].messages
    assert [m.text for m in sent] == ["rules", "turn 2", "ok", "turn 3", "ok", "turn 4"]
    assert len(memory.load("w")) == 1 + 5 * 2
    agent.generate("all", keep_last_turns=0)
    assert len(model.calls[-1].messages) == 1 + 5 * 2 + 1


def test_keep_last_turns_drops_tool_exchanges_with_their_turn() -> None:
    memory = InMemoryConversationMemory()
    tool_turn = [
        Message(content=[TextPart(text="old"), ImagePart(data=PNG, mime_type="image/png")]),
        Message(role="assistant", tool_calls=[ToolCall(id="c", name="t")]),
        Message(role="tool", content=[TextPart(text="r")], tool_call_id="c", name="t"),
        Message.assistant("done"),
    ]
    memory.append("k", [*tool_turn, Message.user("recent"), Message.assistant("yes")])
    model = ScriptedModel(lambda req: "ok")
    Agent(model, memory=memory, conversation_id="k", keep_last_turns=1).generate("now")
    assert [m.text for m in model.calls[0].messages] == ["recent", "yes", "now"]


async def test_second_turn_while_first_runs_is_busy_and_others_run_concurrently() -> None:
    memory = InMemoryConversationMemory()
    release = threading.Event()
    started = threading.Event()

    def slow(request: ModelRequest) -> str:
        started.set()
        release.wait(10)
        return "slow done"

    first_agent = Agent(ScriptedModel(slow), memory=memory)
    second_agent = Agent(ScriptedModel(lambda req: "quick"), memory=memory)
    running = asyncio.create_task(first_agent.agenerate("one", conversation_id="busy"))
    await asyncio.to_thread(started.wait, 10)
    with pytest.raises(ConversationBusyError, match="busy"):
        await second_agent.agenerate("two", conversation_id="busy")
    other = await second_agent.agenerate("other", conversation_id="free")
    assert other.text == "quick" and not running.done()
    release.set()
    assert (await running).text == "slow done"
    assert [m.text for m in memory.load("busy")] == ["one", "slow done"]
    assert (await second_agent.agenerate("two", conversation_id="busy")).text == "quick"


async def test_many_conversations_in_parallel_share_one_memory(memory: ConversationMemory) -> None:
    agent = Agent(ScriptedModel(echo_history), memory=memory)

    async def talk(cid: str) -> None:
        for i in range(3):
            await agent.agenerate(f"{cid}-{i}", conversation_id=cid)

    await asyncio.gather(*(talk(f"conv{n}") for n in range(8)))
    for n in range(8):
        assert [m.text for m in (await memory.aload(f"conv{n}"))][::2] == [
            f"conv{n}-{i}" for i in range(3)
        ]


def test_stream_yields_deltas_and_done() -> None:
    memory = InMemoryConversationMemory()
    agent = Agent(ScriptedModel(lambda req: "hello there world"), memory=memory,
                  conversation_id="s")  # fmt: skip
    events = list(agent.stream("hi"))
    deltas = "".join(e.data["text"] for e in events if e.type == "text_delta")
    assert deltas == "hello there world"
    assert events[-1].type == "done" and events[-1].data["status"] == "completed"
    assert [m.text for m in memory.load("s")] == ["hi", "hello there world"]


async def test_astream_async_iteration() -> None:
    agent = Agent(ScriptedModel(lambda req: "a b"))
    types = [e.type async for e in agent.astream("hi")]
    assert types[-1] == "done" and "text_delta" in types


async def test_sync_api_works_inside_a_running_loop() -> None:
    agent = Agent(ScriptedModel(lambda req: "sync inside async"))
    assert agent.generate("hi").text == "sync inside async"


def test_leaving_a_stream_early_stops_the_turn_and_frees_the_conversation() -> None:
    @tool
    async def slow() -> str:
        """Takes a minute."""
        await asyncio.sleep(60)
        return "late"

    def script(request: ModelRequest) -> str | Message:
        if request.messages[-1].text == "first":
            call = ToolCall(id="c1", name="slow", arguments={})
            return Message(role=MessageRole.ASSISTANT, tool_calls=[call])
        return "second answer"

    memory = InMemoryConversationMemory()
    agent = Agent(ScriptedModel(script), memory=memory, conversation_id="early", tools=[slow])
    for event in agent.stream("first"):
        assert event.type == "assistant"
        break
    # The abandoned turn is stopped before the loop ends: nothing of it is stored and the
    # conversation is free at once.
    assert agent.generate("second").text == "second answer"
    assert [m.text for m in memory.load("early")] == ["second", "second answer"]


def test_turns_that_never_paused_leave_no_reservation_state_behind() -> None:
    # Only tokens handed out in a continuation must be remembered as spent; remembering
    # every turn's token would grow without bound in a long-lived process.
    memory = InMemoryConversationMemory()
    agent = Agent(ScriptedModel(lambda req: "ok"), memory=memory, conversation_id="many")
    for _ in range(5):
        agent.generate("hi")
    assert memory._reservations.holders() == {} and len(memory._spent_tokens) == 0

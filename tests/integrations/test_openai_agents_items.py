"""ConvoqSession (convoq.integrations.openai_agents) on every backend: items round-trip
exactly, are stored as convoq messages, and the session API behaves as the SDK's."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest
from agents.memory import Session, SessionSettings

from convoq.errors import (
    ConvoqError,
    CorruptDataError,
    InvalidMessageError,
)
from convoq.integrations.openai_agents import ConvoqSession
from convoq.memory import (
    ConversationMemory,
    FileConversationMemory,
    InMemoryConversationMemory,
    StoredConversationMemory,
)
from convoq.memory.transfer import aexport_conversation, aimport_conversation
from convoq.messages import FilePart, ImagePart, Message, MessageRole, TextPart, ToolCall
from convoq.summary import Summary
from convoq.window import Window
from tests.integrations.samples import PDF, PNG, every_kind_of_item


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
    assert [type(p) for p in picture.content] == [TextPart, ImagePart, FilePart]
    image, pdf = picture.content[1:]
    assert isinstance(image, ImagePart) and image.data == PNG and image.mime_type == "image/png"
    assert image.provider_options == {"detail": "low"}
    assert isinstance(pdf, FilePart) and pdf.data == PDF and pdf.filename == "report.pdf"
    assert picture.framework is not None and list(picture.framework) == ["openai-agents"]
    # The kept original does not hold the attachment bytes a second time.
    assert base64.b64encode(PNG).decode()[:40] not in json.dumps(picture.framework)
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


async def test_a_damaged_original_is_reported() -> None:
    memory = InMemoryConversationMemory()
    session = ConvoqSession("chat-1", memory)
    await session.add_items([{"type": "reasoning", "id": "rs_1", "summary": []}])
    [stored] = memory.load("chat-1")
    assert stored.framework is not None
    record = stored.framework["openai-agents"]
    for damaged in ({"convoq-unreadable": "not json"}, {"openai-agents": {**record, "version": 2}}):
        memory.clear("chat-1")
        memory.append("chat-1", [stored.model_copy(update={"framework": damaged})])
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
    # It covers the turn of the popped item: what it told of is no longer all stored.
    await memory.acommit_summary("chat-1", Summary.of("q0 to q2", watermark=3, version=1), basis)
    assert await memory.asummary("chat-1") is not None
    assert await session.pop_item() == {"role": "assistant", "content": "a2"}
    assert await memory.asummary("chat-1") is None
    assert [i["content"] for i in await session.get_items()] == ["q0", "a0", "q1", "a1", "q2"]


async def test_a_session_moves_between_backends_by_export_and_import(
    memory: ConversationMemory, tmp_path: Path
) -> None:
    items = every_kind_of_item()
    await ConvoqSession("chat-1", memory).add_items(items)
    document = (await aexport_conversation(memory, "chat-1")).to_json()
    elsewhere = FileConversationMemory(tmp_path / "elsewhere")
    await aimport_conversation(elsewhere, document, conversation_id="moved")
    assert await ConvoqSession("moved", elsewhere).get_items() == items

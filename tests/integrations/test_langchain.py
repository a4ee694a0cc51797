"""convoq memory as a LangChain chat message history (convoq.integrations.langchain), on
every backend, with langchain-core's own fake chat models and a real redis-server."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import redis
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.language_models.fake_chat_models import (
    FakeListChatModel,
    GenericFakeChatModel,
)
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory

from convoq.errors import ConversationBusyError, ConvoqError, InvalidMessageError
from convoq.integrations.langchain import ConvoqChatMessageHistory
from convoq.memory import ConversationMemory, InMemoryConversationMemory
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import FilePart, ImagePart, Message, MessageRole, TextPart, ToolCall
from convoq.redis.keys import KeySchema
from convoq.window import Window
from tests.integrations.samples import B64_PNG, PDF, PNG


def a_conversation() -> list[BaseMessage]:
    """Text, images (a data URL and a base64 block), a file, tool calls with ids and usage,
    tool messages, and a message type convoq has no counterpart for."""
    return [
        SystemMessage("You describe pictures."),
        HumanMessage(
            content=[
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64_PNG}"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
            ]
        ),
        AIMessage(
            content="",
            tool_calls=[{"name": "look", "args": {"zoom": 2}, "id": "call_1"}],
            id="run-1",
            usage_metadata={"input_tokens": 10, "output_tokens": 3, "total_tokens": 13},
            response_metadata={"model_name": "fake"},
        ),
        ToolMessage(content="a tabby cat", tool_call_id="call_1"),
        AIMessage("A cat."),
        HumanMessage(
            content=[
                {
                    "type": "image",
                    "source_type": "base64",
                    "data": B64_PNG,
                    "mime_type": "image/png",
                },
                {
                    "type": "file",
                    "source_type": "base64",
                    "mime_type": "application/pdf",
                    "data": base64.b64encode(PDF).decode(),
                    "filename": "report.pdf",
                },
            ]
        ),
        ChatMessage(role="critic", content="unicode ✓ é"),
        HumanMessage("thanks", id="h-9", name="ada"),
    ]


def test_messages_come_back_exactly_as_added(memory: ConversationMemory) -> None:
    messages = a_conversation()
    history = ConvoqChatMessageHistory("chat-1", memory)
    history.add_messages(messages[:3])
    history.add_messages(messages[3:])
    assert ConvoqChatMessageHistory("chat-1", memory).messages == messages
    assert len(memory.load("chat-1")) == len(messages)


async def test_async_methods(memory: ConversationMemory) -> None:
    messages = a_conversation()
    history = ConvoqChatMessageHistory("chat-1", memory)
    await history.aadd_messages(messages)
    assert await history.aget_messages() == messages
    await history.aclear()
    assert await history.aget_messages() == []


def test_messages_are_stored_as_convoq_messages(memory: ConversationMemory) -> None:
    ConvoqChatMessageHistory("chat-1", memory).add_messages(a_conversation())
    stored = memory.load("chat-1")
    assert [m.role for m in stored] == [
        MessageRole.SYSTEM,
        MessageRole.USER,
        MessageRole.ASSISTANT,
        MessageRole.TOOL,
        MessageRole.ASSISTANT,
        MessageRole.USER,
        MessageRole.ASSISTANT,
        MessageRole.USER,
    ]
    # Plain messages are stored plainly: nothing kept beside them.
    assert stored[0] == Message.system("You describe pictures.")
    assert stored[3] == Message(
        role=MessageRole.TOOL, content=[TextPart(text="a tabby cat")], tool_call_id="call_1"
    )
    assert stored[4] == Message.assistant("A cat.")
    # The image given by URL stays a URL, inside the kept original.
    text, image = stored[1].content
    assert text == TextPart(text="What is this?")
    assert isinstance(image, ImagePart) and image.data == PNG
    assert "https://example.com/cat.png" in json.dumps(stored[1].framework)
    assert stored[2].tool_calls == [ToolCall(id="call_1", name="look", arguments={"zoom": 2})]
    image, pdf = stored[5].content
    assert isinstance(image, ImagePart) and image.data == PNG
    assert isinstance(pdf, FilePart) and pdf.data == PDF and pdf.filename == "report.pdf"
    assert stored[5].framework is not None and list(stored[5].framework) == ["langchain"]
    # The kept original does not hold the attachment bytes a second time.
    assert B64_PNG[:40] not in json.dumps(stored[5].framework)


def test_a_turn_convoq_wrote_reads_as_langchain_messages(memory: ConversationMemory) -> None:
    call = ToolCall(id="call_9", name="lookup", arguments={"q": "x"})
    memory.append(
        "chat-1",
        [
            Message.user("hi"),
            Message.assistant("Let me look.", [call]),
            Message.tool_result(call, "found"),
        ],
    )
    assert ConvoqChatMessageHistory("chat-1", memory).messages == [
        HumanMessage("hi"),
        AIMessage(
            "Let me look.", tool_calls=[{"name": "lookup", "args": {"q": "x"}, "id": "call_9"}]
        ),
        ToolMessage("found", tool_call_id="call_9"),
    ]


def test_last_n_messages_reads_only_that_many_turns() -> None:
    asked: list[Window] = []

    class Watched(InMemoryConversationMemory):
        async def _read(self, conversation_id: str, window: Window) -> list[Message]:
            asked.append(window)
            return await super()._read(conversation_id, window)

    memory = Watched()
    messages = a_conversation()
    ConvoqChatMessageHistory("chat-1", memory).add_messages(messages)
    for n in range(1, len(messages) + 2):
        asked.clear()
        assert (
            ConvoqChatMessageHistory("chat-1", memory, last_n_messages=n).messages == messages[-n:]
        )
        assert [w.keep_last_turns for w in asked] == [n]


@pytest.mark.parametrize(
    "bad", [["just a string"], [{"role": "user", "content": "a dict"}], HumanMessage("one")]
)
def test_bad_input_is_refused_and_nothing_is_written(memory: ConversationMemory, bad: Any) -> None:
    history = ConvoqChatMessageHistory("chat-1", memory)
    history.add_messages([HumanMessage("kept")])
    with pytest.raises(ConvoqError):
        history.add_messages(
            [HumanMessage("first of the batch"), *bad] if isinstance(bad, list) else bad
        )
    assert history.messages == [HumanMessage("kept")]


def test_bad_arguments_are_refused() -> None:
    memory = InMemoryConversationMemory()
    for n in (0, -1, True, "3"):
        with pytest.raises(ConvoqError, match="last_n_messages"):
            ConvoqChatMessageHistory("chat-1", memory, last_n_messages=n)  # type: ignore[arg-type]
    with pytest.raises(ConvoqError, match="busy_timeout_s"):
        ConvoqChatMessageHistory("chat-1", memory, busy_timeout_s=-1)
    with pytest.raises(InvalidMessageError):
        ConvoqChatMessageHistory("chat-1", memory).add_message("text")  # type: ignore[arg-type]


def test_it_is_langchains_chat_history() -> None:
    assert isinstance(
        ConvoqChatMessageHistory("c", InMemoryConversationMemory()), BaseChatMessageHistory
    )


# langchain-core 1.x deprecates RunnableWithMessageHistory (in favour of LangGraph); it is
# still what takes a chat history, so it is tested as it ships.
uses_deprecated_runnable = pytest.mark.filterwarnings(
    "ignore:RunnableWithMessageHistory is deprecated"
)


def chain_with_history(
    memory: ConversationMemory, model: Any, **history_options: Any
) -> RunnableWithMessageHistory:
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are brief."), MessagesPlaceholder("history"), ("human", "{question}")]
    )
    return RunnableWithMessageHistory(
        prompt | model,
        lambda session_id: ConvoqChatMessageHistory(session_id, memory, **history_options),
        input_messages_key="question",
        history_messages_key="history",
    )


@uses_deprecated_runnable
def test_runnable_with_message_history(memory: ConversationMemory) -> None:
    model = FakeListChatModel(responses=["Hello Ada.", "Your name is Ada."])
    chain = chain_with_history(memory, model)
    config = {"configurable": {"session_id": "chat-1"}}
    assert chain.invoke({"question": "I am Ada."}, config=config).content == "Hello Ada."
    assert chain.invoke({"question": "Who am I?"}, config=config).content == "Your name is Ada."
    stored = ConvoqChatMessageHistory("chat-1", memory).messages
    assert [type(m).__name__ for m in stored] == ["HumanMessage", "AIMessage"] * 2
    assert [m.content for m in stored] == [
        "I am Ada.",
        "Hello Ada.",
        "Who am I?",
        "Your name is Ada.",
    ]
    assert [m.text for m in memory.load("chat-1")] == [m.content for m in stored]


@uses_deprecated_runnable
async def test_runnable_with_message_history_async_and_windowed(memory: ConversationMemory) -> None:
    replies = iter([AIMessage(f"answer {n}", id=f"ai-{n}") for n in range(3)])
    sent: list[list[BaseMessage]] = []

    class Recording(GenericFakeChatModel):
        async def _agenerate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
            sent.append(list(messages))
            return await super()._agenerate(messages, *args, **kwargs)

    chain = chain_with_history(memory, Recording(messages=replies), last_n_messages=2)
    config = {"configurable": {"session_id": "chat-1"}}
    for n in range(3):
        answer = await chain.ainvoke({"question": f"question {n}"}, config=config)
        assert answer.content == f"answer {n}"
    # The third call sent the system prompt, the newest two stored messages, the question.
    assert [m.content for m in sent[2]] == [
        "You are brief.",
        "question 1",
        "answer 1",
        "question 2",
    ]
    everything = await ConvoqChatMessageHistory("chat-1", memory).aget_messages()
    assert [m.content for m in everything] == [
        "question 0",
        "answer 0",
        "question 1",
        "answer 1",
        "question 2",
        "answer 2",
    ]
    assert everything[5] == AIMessage("answer 2", id="ai-2")


async def test_a_running_convoq_turn_keeps_writes_out(redis_url: str, key_prefix: str) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    other = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        await other.areserve("chat-1", "a-running-turn")
        history = ConvoqChatMessageHistory("chat-1", memory, busy_timeout_s=0)
        with pytest.raises(ConversationBusyError):
            await history.aadd_messages([HumanMessage("too early")])
        await other.acommit_turn("chat-1", "a-running-turn", [Message.user("the turn")])
        await history.aadd_messages([HumanMessage("after it")])
        assert await history.aget_messages() == [HumanMessage("the turn"), HumanMessage("after it")]
    finally:
        await memory.aclose()
        await other.aclose()


async def test_clear_is_refused_while_a_turn_runs(redis_url: str, key_prefix: str) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        history = ConvoqChatMessageHistory("chat-1", memory)
        await history.aadd_messages([HumanMessage("kept")])
        await memory.areserve("chat-1", "a-running-turn")
        with pytest.raises(ConversationBusyError):
            await history.aclear()
        await memory.arelease("chat-1", "a-running-turn")
        assert await history.aget_messages() == [HumanMessage("kept")]
        history.clear()
        assert history.messages == []
    finally:
        await memory.aclose()


def test_without_a_memory_it_uses_redis_from_the_settings(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVOQ_REDIS_URL", redis_url)
    monkeypatch.setenv("CONVOQ_PREFIX", key_prefix)
    history = ConvoqChatMessageHistory("chat-1")
    history.add_messages([HumanMessage("hi")])
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        assert memory.load("chat-1") == [Message.user("hi")]
    finally:
        memory.close()
        assert isinstance(history.memory, RedisConversationMemory)
        history.memory.close()


def test_images_are_stored_once_per_conversation_on_redis(redis_url: str, key_prefix: str) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    client = redis.Redis.from_url(redis_url)
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64_PNG}"}}
    try:
        history = ConvoqChatMessageHistory("chat-1", memory)
        for n in range(3):
            history.add_messages([HumanMessage(content=[image]), AIMessage(f"seen {n}")])
        assert list(client.hgetall(KeySchema(key_prefix).blobs("chat-1")).values()) == [PNG]
        assert len(history.messages) == 6
    finally:
        client.close()
        memory.close()

"""The memory interface as the memory guide and Rig's trait document it: three methods,
sync or async, busy turns as memory errors, any conversation id, and the test helpers a
memory author gets (convoq.testing) with the conformance suite run on every backend."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from convoq import Agent, Message
from convoq.errors import (
    ConfigurationError,
    ConversationBusyError,
    ConversationMemoryError,
)
from convoq.memory import ConversationMemory, InMemoryConversationMemory
from convoq.messages import MessageRole
from convoq.models import ScriptedModel
from convoq.testing import FailingMemory, MemoryFailure, RecordingModel, SlowMemory
from convoq.testing.conformance import AWKWARD_IDS, CHECKS, check_memory
from tests.support.memory_backends import BACKENDS, backend_url, close_memory, make_memory


class GuideMemory:
    """The guide's three methods, plain, on a dict; no convoq base class."""

    def __init__(self) -> None:
        self.store: dict[str, list[Message]] = {}

    def load(self, conversation_id: str) -> list[Message]:
        return [m.model_copy(deep=True) for m in self.store.get(conversation_id, [])]

    def append(self, conversation_id: str, messages: list[Message]) -> None:
        self.store.setdefault(conversation_id, []).extend(m.model_copy(deep=True) for m in messages)

    def clear(self, conversation_id: str) -> None:
        self.store.pop(conversation_id, None)


class AsyncGuideMemory:
    """The same three methods, async (Rig's trait shape)."""

    def __init__(self) -> None:
        self.inner = GuideMemory()

    async def load(self, conversation_id: str) -> list[Message]:
        await asyncio.sleep(0)
        return self.inner.load(conversation_id)

    async def append(self, conversation_id: str, messages: list[Message]) -> None:
        await asyncio.sleep(0)
        self.inner.append(conversation_id, messages)

    async def clear(self, conversation_id: str) -> None:
        self.inner.clear(conversation_id)


class SubclassGuideMemory(ConversationMemory):
    """A ConversationMemory subclass whose load takes only the id (no window arguments)."""

    def __init__(self) -> None:
        self.inner = GuideMemory()

    def load(self, conversation_id: str) -> list[Message]:
        return self.inner.load(conversation_id)

    def append(self, conversation_id: str, messages: list[Message]) -> None:
        self.inner.append(conversation_id, messages)

    def clear(self, conversation_id: str) -> None:
        self.inner.clear(conversation_id)


CUSTOM = {"plain": GuideMemory, "async": AsyncGuideMemory, "subclass": SubclassGuideMemory}


@pytest.fixture(params=[*BACKENDS, *CUSTOM])
def any_memory(request: pytest.FixtureRequest, tmp_path: Path, key_prefix: str) -> Iterator[Any]:
    if request.param in CUSTOM:
        yield CUSTOM[request.param]()
        return
    url = backend_url(request, request.param)
    memory = make_memory(request.param, tmp_path, url, key_prefix)
    yield memory
    close_memory(memory)


@pytest.mark.parametrize("check", list(CHECKS.values()), ids=list(CHECKS))
async def test_conformance_suite(any_memory: Any, check: Any) -> None:
    await check(any_memory)


def test_conformance_suite_catches_a_memory_that_mixes_conversations() -> None:
    class Leaky(GuideMemory):
        def load(self, conversation_id: str) -> list[Message]:
            return super().load(conversation_id.lower())

        def append(self, conversation_id: str, messages: list[Message]) -> None:
            super().append(conversation_id.lower(), messages)

    with pytest.raises(AssertionError, match="conversation"):
        check_memory(Leaky())


@pytest.mark.parametrize("kind", list(CUSTOM))
def test_guide_shaped_memory_works_with_the_window_and_a_budget(kind: str) -> None:
    memory = CUSTOM[kind]()
    model = RecordingModel()
    agent = Agent(model, memory=memory, conversation_id="user 42", keep_last_turns=2)
    for text in ("a", "b", "c", "d"):
        agent.generate(text)
    # load ignores the window: the agent trims what it sends anyway.
    assert [m.text for m in model.sent[-1] if m.role == MessageRole.USER] == ["b", "c", "d"]
    agent.generate("e", max_history_tokens=0, keep_last_turns=0)
    assert [m.text for m in model.sent[-1]] == ["e"]
    assert len(agent.memory.load("user 42")) == 10  # type: ignore[union-attr]


@pytest.mark.parametrize("cid", AWKWARD_IDS)
def test_awkward_ids_work_through_the_agent_on_every_backend(
    request: pytest.FixtureRequest, tmp_path: Path, key_prefix: str, cid: str
) -> None:
    for backend in BACKENDS:
        url = backend_url(request, backend)
        memory = make_memory(backend, tmp_path / backend, url, key_prefix)
        try:
            agent = Agent(ScriptedModel(lambda req: f"n={len(req.messages)}"), memory=memory)
            assert agent.generate("one", conversation_id=cid).text == "n=1"
            assert agent.generate("two", conversation_id=cid).text == "n=3"
            assert agent.generate("other", conversation_id=cid + "x").text == "n=1"
        finally:
            close_memory(memory)


def test_object_without_the_three_methods_is_refused() -> None:
    class Half:
        def load(self, conversation_id: str) -> list[Message]:
            return []

    with pytest.raises(ConfigurationError, match="lacks append, clear"):
        Agent(RecordingModel(), memory=Half())


def test_a_busy_conversation_is_a_memory_error() -> None:
    assert issubclass(ConversationBusyError, ConversationMemoryError)
    memory = InMemoryConversationMemory()
    memory.reserve("c", "first")
    agent = Agent(RecordingModel(), memory=memory, conversation_id="c")
    with pytest.raises(ConversationMemoryError, match="awaiting approval"):
        agent.generate("second")


def test_a_failing_load_stops_the_turn_before_the_model() -> None:
    model = RecordingModel()
    agent = Agent(model, memory=FailingMemory("load"), conversation_id="c")
    with pytest.raises(ConversationMemoryError, match="model was not called") as raised:
        agent.generate("hi")
    assert isinstance(raised.value.__cause__, MemoryFailure)
    assert model.requests == []
    # The conversation is free again afterwards.
    agent.memory.fail_on = frozenset()  # type: ignore[union-attr]
    assert agent.generate("again").text == "seen 1"


def test_a_failing_append_keeps_the_answer_in_the_error() -> None:
    memory = FailingMemory("append")
    agent = Agent(RecordingModel(), memory=memory, conversation_id="c")
    with pytest.raises(ConversationMemoryError) as raised:
        agent.generate("hi")
    assert raised.value.response.text == "seen 1"
    assert memory.inner.load("c") == []
    assert [op for op, _ in memory.calls] == ["load", "append"]


async def test_a_slow_memory_lets_other_conversations_run_and_cancel_frees_its_own() -> None:
    memory = SlowMemory(delay_s=30)
    agent = Agent(RecordingModel(), memory=memory)
    stuck = asyncio.create_task(agent.agenerate("slow", conversation_id="c"))
    await asyncio.sleep(0.05)
    stuck.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stuck
    memory.delay_s = 0
    assert (await agent.agenerate("now", conversation_id="c")).text == "seen 1"


def test_failing_memory_refuses_unknown_operations() -> None:
    with pytest.raises(ValueError, match="fail_on"):
        FailingMemory("explode")

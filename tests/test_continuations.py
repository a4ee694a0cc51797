"""Continuations run once and parked turns do not hold a conversation for ever, on every
backend: single use is recorded by the store (so any memory object or process on it sees
it), parked turns expire after approval_ttl_s, and clear / discard free them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from convoq import Agent, Message, ToolCall, tool
from convoq.errors import ConversationBusyError, ConvoqError
from convoq.memory import ConversationMemory, FileConversationMemory, InMemoryConversationMemory
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel
from convoq.redis.keys import KeySchema
from tests.support.clock import TestClock
from tests.support.memory_backends import BACKENDS, backend_url, close_memory, make_memory
from tests.support.redis_cluster import plain_client

ran: list[str] = []


@tool(requires_approval=True)
def transfer(amount: int) -> str:
    """Move money (a side effect that must happen once)."""
    ran.append(f"sent {amount}")
    return f"sent {amount}"


def banker(request: ModelRequest) -> str | Message:
    last = request.messages[-1]
    if last.role == MessageRole.USER and last.text == "pay":
        call = ToolCall(id="t1", name="transfer", arguments={"amount": 5})
        return Message(role="assistant", tool_calls=[call])
    if last.role == MessageRole.TOOL:
        return f"done: {last.text}"
    return f"answer to {last.text}"


class Store:
    """Memory objects of one backend that share one store (files, Redis keys)."""

    def __init__(self, backend: str, tmp_path: Path, url: str | None, prefix: str) -> None:
        self.backend, self.tmp_path, self.url, self.prefix = backend, tmp_path, url, prefix
        self.opened: list[ConversationMemory] = []

    def memory(self) -> ConversationMemory:
        opened = make_memory(self.backend, self.tmp_path, self.url, self.prefix)
        self.opened.append(opened)
        return opened

    def expire_hold(self, cid: str) -> None:
        """End a parked turn's hold on Redis as its lifetime would: the hold is the lease
        key, with the approval ttl as its PX (the in-process stores read the test clock)."""
        if self.url is not None:
            client = plain_client(self.url)
            try:
                assert client.delete(KeySchema(self.prefix).lease(cid)) == 1
            finally:
                client.close()

    def agent(self, memory: ConversationMemory, **options: float) -> Agent:
        return Agent(ScriptedModel(banker), memory=memory, conversation_id="c", tools=[transfer],
                     **options)  # type: ignore[arg-type]  # fmt: skip


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path, key_prefix: str) -> Iterator[Store]:
    ran.clear()
    url = backend_url(request, request.param)
    shared = Store(request.param, tmp_path, url, key_prefix)
    yield shared
    for memory in shared.opened:
        close_memory(memory)


def test_a_continuation_resumed_through_two_memories_on_one_store_runs_once(
    store: Store,
) -> None:
    if store.backend == "in_memory":
        pytest.skip("two in-memory objects share no store")
    first, second = store.memory(), store.memory()
    paused = store.agent(first).generate("pay")
    wire = paused.continuation.model_dump_json()  # type: ignore[union-attr]
    done = store.agent(second).resume(wire, {"t1": True})
    assert done.text == "done: sent 5"
    with pytest.raises(ConvoqError, match="already resumed"):
        store.agent(first).resume(wire, {"t1": True})
    with pytest.raises(ConvoqError, match="already resumed"):
        store.agent(store.memory()).resume(json.loads(wire), {"t1": True})
    assert ran == ["sent 5"]
    stored = [m.role.value for m in first.load("c")]
    assert stored == ["user", "assistant", "tool", "assistant"]  # the turn, stored once
    # The first object's hold on the parked turn went with it: the conversation is free.
    assert store.agent(first).generate("next").text == "answer to next"


def test_a_dropped_parked_turn_frees_its_conversation_after_the_approval_ttl(
    store: Store, clock: TestClock
) -> None:
    memory = store.memory()
    agent = store.agent(memory, approval_ttl_s=600)
    wire = agent.generate("pay").continuation.model_dump_json()  # type: ignore[union-attr]
    with pytest.raises(ConversationBusyError):
        agent.generate("too early")
    # The approval ttl passes with nobody resuming (the response was dropped): on this
    # process's clock, and on Redis's, where the parked turn's hold is a key with that PX.
    clock.advance(601)
    store.expire_hold("c")
    assert agent.generate("later").text == "answer to later"
    with pytest.raises(ConvoqError, match="expired"):
        agent.resume(wire, {"t1": True})
    assert ran == []
    assert [m.text for m in memory.load("c")] == ["later", "answer to later"]


def test_clear_frees_a_parked_turn(store: Store) -> None:
    memory = store.memory()
    agent = store.agent(memory)
    wire = agent.generate("pay").continuation.model_dump_json()  # type: ignore[union-attr]
    memory.clear("c")
    assert agent.generate("fresh").text == "answer to fresh"
    # Its continuation cannot go on: the history it paused in is gone.
    with pytest.raises(ConvoqError, match=r"already resumed|expired"):
        agent.resume(wire, {"t1": True})
    assert ran == []
    assert [m.text for m in memory.load("c")] == ["fresh", "answer to fresh"]


def test_discard_frees_the_conversation_and_spends_the_continuation(store: Store) -> None:
    memory = store.memory()
    agent = store.agent(memory)
    wire = agent.generate("pay").continuation.model_dump_json()  # type: ignore[union-attr]
    agent.discard(wire)
    assert agent.generate("next").text == "answer to next"
    with pytest.raises(ConvoqError, match="already resumed or discarded"):
        agent.resume(wire, {"t1": True})
    assert ran == []
    assert [m.text for m in memory.load("c")] == ["next", "answer to next"]


def test_spent_tokens_are_dropped_from_the_file_once_they_expire(
    tmp_path: Path, clock: TestClock
) -> None:
    memory = FileConversationMemory(tmp_path)
    agent = Agent(ScriptedModel(banker), memory=memory, conversation_id="c", tools=[transfer],
                  approval_ttl_s=600)  # fmt: skip
    wire = agent.generate("pay").continuation.model_dump_json()  # type: ignore[union-attr]
    agent.resume(wire, {"t1": True})
    token = json.loads(wire)["token"]
    document = json.loads(memory.path_for("c").read_bytes())
    assert document["format_version"] == 3 and token in document["spent"]
    clock.advance(601)  # the continuation has expired: remembering its token serves nothing
    agent.generate("next")
    document = json.loads(memory.path_for("c").read_bytes())
    assert document["format_version"] == 2 and "spent" not in document


def test_spent_tokens_are_forgotten_in_process_once_they_expire(clock: TestClock) -> None:
    memory = InMemoryConversationMemory()
    agent = Agent(ScriptedModel(banker), memory=memory, conversation_id="c", tools=[transfer],
                  approval_ttl_s=600)  # fmt: skip
    wire = agent.generate("pay").continuation.model_dump_json()  # type: ignore[union-attr]
    agent.resume(wire, {"t1": True})
    assert len(memory._spent_tokens) == 1
    clock.advance(601)  # expired: it cannot be resumed anyway, so nothing needs to remember it
    assert len(memory._spent_tokens) == 0 and memory._spent_tokens._until == {}


@pytest.mark.parametrize(
    "options",
    [{"if_busy": "maybe"}, {"busy_timeout_s": -1}, {"approval_ttl_s": 0}],
)
def test_bad_busy_and_approval_options_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(ConvoqError, match=r"if_busy|busy_timeout_s|approval_ttl_s"):
        Agent(ScriptedModel(banker), **options)  # type: ignore[arg-type]

"""A token budget counted by the caller's own counter reads Redis from the newest turn back
until the budget is spent, for an Agent's or a worker's turn (what a turn sends: a stored
summary honoured) as for a plain load: the bytes read follow the window, not the history.

Bytes are measured on the wire, by a loopback proxy in front of the test redis-server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from convoq import Agent
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import Message
from convoq.models import ModelRequest, ScriptedModel
from convoq.redis import TurnProtocol
from convoq.summary import Summary
from convoq.tokens import TokenizerCounter
from convoq.window import Window
from tests.support.redis_proxy import LossyProxy
from tests.support.redis_server import RedisServer

TURNS = 2000
FILLER = "word " * 100  # about 500 bytes a turn: about 1 MB of history
BUDGET = 1000
WORDS = TokenizerCounter(lambda text: len(text.split()))


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[LossyProxy]:
    upstream = LossyProxy(int(redis_server.url.rsplit(":", 1)[1].split("/")[0]))
    yield upstream
    upstream.close()


def history() -> list[Message]:
    return [
        m
        for i in range(TURNS)
        for m in (Message.user(f"q{i} {FILLER}"), Message.assistant(f"a{i}"))
    ]


async def stored(redis_url: str, prefix: str, cid: str) -> int:
    """Store the long history; its size in bytes."""
    memory = RedisConversationMemory(redis_url, prefix=prefix)
    try:
        await memory.aappend(cid, history())
        return sum(len(m.text) for m in history())
    finally:
        await memory.aclose()


def user_texts(messages: list[Message]) -> list[str]:
    return [m.text.split()[0] for m in messages if m.role == "user"]


async def test_an_agent_turn_with_its_own_counter_reads_only_the_window(
    redis_url: str, key_prefix: str, proxy: LossyProxy
) -> None:
    size = await stored(redis_url, key_prefix, "long")
    seen: list[ModelRequest] = []

    def answer(request: ModelRequest) -> str:
        seen.append(request)
        return "ok"

    memory = RedisConversationMemory(proxy.url, prefix=key_prefix)
    agent = Agent(ScriptedModel(answer), memory=memory, conversation_id="long",
                  max_history_tokens=BUDGET, token_counter=WORDS)  # fmt: skip
    try:
        await memory.aload("long", last_turns=1)  # connected, scripts loaded
        before = proxy.replied_bytes
        await agent.agenerate("now")
        read = proxy.replied_bytes - before
    finally:
        await memory.aclose()
    sent = user_texts(seen[-1].messages)
    assert sent[-1] == "now" and sent[-2] == f"q{TURNS - 1}"
    assert 0 < len(sent) - 1 < 20  # the newest turns the budget holds
    # A chunk of the newest turns and the write of this one, not the ~1 MB before them.
    assert read < size / 10, (read, size)


async def test_a_worker_window_with_a_summary_stops_at_the_budget_and_the_watermark(
    redis_url: str, key_prefix: str, proxy: LossyProxy
) -> None:
    size = await stored(redis_url, key_prefix, "sum")
    proto = TurnProtocol.from_url(proxy.url, prefix=key_prefix)
    try:  # no summary stored yet: what a worker's turn sends is the budget's newest turns
        await proto.history("sum", last_turns=1)  # connected, scripts loaded
        before = proxy.replied_bytes
        sent = await proto.window("sum", Window(None, BUDGET, WORDS, with_summary=True))
        read = proxy.replied_bytes - before
        assert sent == Window(None, BUDGET, WORDS).apply(history()) and sent
        assert read < size / 10, (read, size)
    finally:
        await proto.close()
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        _, _, basis = await memory.asummary_state("sum")
        summary = Summary.of("all but the last five", watermark=TURNS - 5, version=1)
        await memory.acommit_summary("sum", summary, basis)
    finally:
        await memory.aclose()
    proto = TurnProtocol.from_url(proxy.url, prefix=key_prefix)
    try:
        await proto.history("sum", last_turns=1)  # connected, scripts loaded
        # What is sent: the summary, then the turns after its watermark that the budget
        # holds (the same rule applied to the whole history, read in full, in this process).
        after = [summary.message(), *history()[-10:]]
        for budget, newest in [(BUDGET, 5), (250, 2)]:  # stopped by the watermark; the budget
            window = Window(None, budget, WORDS, with_summary=True)
            before = proxy.replied_bytes
            sent = await proto.window("sum", window)
            read = proxy.replied_bytes - before
            assert sent == Window(None, budget, WORDS).apply(after)
            assert user_texts(sent) == [f"q{i}" for i in range(TURNS - newest, TURNS)]
            # A chunk of the newest turns, never the ~1 MB before them.
            assert read < size / 10, (read, size)
    finally:
        await proto.close()

"""ConvoqSession.pop_item racing add_items from another thread on one conversation: every
added item stays, in order, and exactly the popped ones go, on every backend; a pop waits
for a turn holding the conversation instead of refusing at once."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from convoq.errors import ConversationBusyError
from convoq.integrations.openai_agents import ConvoqSession
from convoq.memory import ConversationMemory
from convoq.messages import Message
from tests.support.memory_backends import backend_url, close_memory, make_memory

# Rounds of one add_items against one pop_item. In memory and in files a pop holds the
# conversation's in-process reservation, which an add waiting on it polls every 50 ms;
# fewer rounds keep those runs short.
ROUNDS = {"redis": 1000, "in_memory": 300, "file": 60}
SEED = [{"role": "user", "content": f"seed {n}"} for n in range(3)]


def batch(n: int) -> list[dict[str, Any]]:
    """What round ``n`` adds: a whole turn of two messages (a pop then shortens it, the
    next pop takes the turn) or a lone assistant message (continuing the last turn)."""
    if n % 2 == 0:
        return [{"role": "user", "content": f"q{n}"}, {"role": "assistant", "content": f"a{n}"}]
    return [{"role": "assistant", "content": f"more {n}"}]


def run_in_thread(
    barrier: threading.Barrier, rounds: int, step: Callable[[int], Awaitable[Any]]
) -> tuple[threading.Thread, list[Any], list[BaseException]]:
    """A thread with its own event loop running ``step(n)`` for each round, every round
    started together with the other thread's (the barrier)."""
    results: list[Any] = []
    errors: list[BaseException] = []

    async def loop() -> None:
        for n in range(rounds):
            barrier.wait(timeout=30)
            try:
                results.append(await step(n))
            except Exception as exc:
                errors.append(exc)

    thread = threading.Thread(target=asyncio.run, args=(loop(),), daemon=True)
    return thread, results, errors


@pytest.fixture(params=list(ROUNDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path, key_prefix: str) -> Any:
    memory = make_memory(request.param, tmp_path, backend_url(request, request.param), key_prefix)
    yield request.param, memory
    close_memory(memory)


def test_pop_item_racing_add_items_loses_and_misplaces_nothing(
    backend: tuple[str, ConversationMemory],
) -> None:
    name, memory = backend
    rounds = ROUNDS[name]
    # In memory nothing waits on I/O: threads switching far more often than every 5 ms
    # make its steps interleave too.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5 if name == "in_memory" else switch)
    try:
        popped = race(name, memory, rounds)
    finally:
        sys.setswitchinterval(switch)
    added = SEED + [item for n in range(rounds) for item in batch(n)]
    # Items are unique, the store only appends at its end and pops its newest: what is
    # left is every item ever added, in order, but exactly those popped.
    assert len({item["content"] for item in popped}) == rounds
    assert all(item in added for item in popped)
    left = asyncio.run(ConvoqSession("race", memory).get_items())
    assert left == [item for item in added if item not in popped]


def race(name: str, memory: ConversationMemory, rounds: int) -> list[Any]:
    """``rounds`` pops against as many adds; what the pops returned."""
    adder, popper = ConvoqSession("race", memory), ConvoqSession("race", memory)
    asyncio.run(adder.add_items(SEED))
    barrier = threading.Barrier(2)
    adds, _, add_errors = run_in_thread(barrier, rounds, lambda n: adder.add_items(batch(n)))
    pops, popped, pop_errors = run_in_thread(barrier, rounds, lambda n: popper.pop_item())
    started = time.monotonic()
    adds.start()
    pops.start()
    for thread in (adds, pops):
        thread.join(timeout=120)
        assert not thread.is_alive()
    elapsed = time.monotonic() - started

    print(f"{name}: {rounds} races in {elapsed:.1f} s")
    assert add_errors == [] and pop_errors == []
    assert len(popped) == rounds and None not in popped
    return popped


async def _held_session(memory: ConversationMemory, busy_timeout_s: float) -> ConvoqSession:
    """A session of "chat-1" holding one user item, the conversation held by a convoq turn
    (an Agent's, a worker's on Redis) as ``a-running-turn``."""
    session = ConvoqSession("chat-1", memory, busy_timeout_s=busy_timeout_s)
    await session.add_items([{"role": "user", "content": "q"}])
    await memory.areserve("chat-1", "a-running-turn")
    return session


async def test_pop_item_waits_for_a_turn_holding_the_conversation(
    backend: tuple[str, ConversationMemory],
) -> None:
    _, memory = backend
    session = await _held_session(memory, busy_timeout_s=30)
    pop = asyncio.create_task(session.pop_item())
    done, _ = await asyncio.wait({pop}, timeout=0.5)
    assert not done  # still waiting: not refused at once
    await memory.acommit_turn("chat-1", "a-running-turn", [Message.assistant("the turn's")])
    # It pops once the turn is stored: the newest item is then the turn's.
    assert await asyncio.wait_for(pop, 10) == {"role": "assistant", "content": "the turn's"}
    assert await session.get_items() == [{"role": "user", "content": "q"}]


async def test_pop_item_gives_up_after_busy_timeout_s_and_changes_nothing(
    backend: tuple[str, ConversationMemory],
) -> None:
    _, memory = backend
    session = await _held_session(memory, busy_timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(ConversationBusyError, match="chat-1"):
        await session.pop_item()
    assert time.monotonic() - started >= 0.3
    await memory.arelease("chat-1", "a-running-turn")
    assert await session.get_items() == [{"role": "user", "content": "q"}]

"""A conformance suite for conversation memories: run it against your own store.

Each check is an async function of a memory (a :class:`ConversationMemory` or any object
with the guide's ``load``/``append``/``clear``, sync or async) that raises AssertionError
naming what broke. Checks use fresh conversation ids of their own, so they may run against
a store that already holds data. With pytest::

    from convoq.testing.conformance import CHECKS

    @pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
    async def test_my_memory(check):
        await check(MyMemory())

or all at once: ``check_memory(MyMemory())`` (blocking) / ``await acheck_memory(...)``.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from convoq._sync import run_sync
from convoq.agent import Agent
from convoq.memory.adapt import as_memory
from convoq.memory.base import ConversationMemory
from convoq.messages import FilePart, ImagePart, Message, MessageRole, TextPart, ToolCall
from convoq.testing import RecordingModel

Check = Callable[[Any], Awaitable[None]]

# Ids every memory must keep apart and accept (besides plain ones).
AWKWARD_IDS = ("user 42", "o'brien", 'say "hi"', "{braces}", "a/b", "..", "../x", "ü名", "A", "a")


def _run_id() -> str:
    return f"conf-{secrets.token_hex(4)}"


def sample_turn(text: str = "look") -> list[Message]:
    """A whole turn with attachments, provider options and a tool round."""
    user = Message(
        role=MessageRole.USER,
        content=[
            TextPart(text=text),
            ImagePart(data=bytes(range(256)), mime_type="image/png", provider_options={"d": 1}),
            FilePart(data=b"%PDF-1.4\x00\xff", mime_type="application/pdf", filename="r.pdf"),
        ],
    )
    call = ToolCall(id="call-1", name="lookup", arguments={"q": text})
    return [
        user,
        Message(role=MessageRole.ASSISTANT, content=[], tool_calls=[call]),
        Message(role=MessageRole.TOOL, content=[TextPart(text="found")], tool_call_id="call-1"),
        Message.assistant(f"answer to {text}"),
    ]


async def unknown_conversation_loads_empty(memory: Any) -> None:
    loaded = await as_memory(memory).aload(_run_id())
    assert loaded == [], f"load of an unknown conversation gave {loaded!r}, not []"


async def turn_round_trips_exactly(memory: Any) -> None:
    mem, cid, turn = as_memory(memory), _run_id(), sample_turn()
    await mem.aappend(cid, turn)
    assert await mem.aload(cid) == turn, "a stored turn did not load back exactly"


async def appends_accumulate_in_order(memory: Any) -> None:
    mem, cid = as_memory(memory), _run_id()
    expected: list[Message] = []
    for index in range(3):
        turn = [Message.user(f"u{index}"), Message.assistant(f"a{index}")]
        await mem.aappend(cid, turn)
        expected += turn
    assert await mem.aload(cid) == expected, "appended turns did not load in order"


async def awkward_ids_work_and_stay_isolated(memory: Any) -> None:
    mem, run = as_memory(memory), _run_id()
    ids = [f"{run} {name}" for name in AWKWARD_IDS] + [f"{name}{run}" for name in AWKWARD_IDS]
    for cid in ids:
        await mem.aappend(cid, [Message.user(cid)])
    for cid in ids:
        loaded = await mem.aload(cid)
        assert loaded == [Message.user(cid)], f"conversation {cid!r} loaded {loaded!r}"


async def clear_removes_only_that_conversation(memory: Any) -> None:
    mem, run = as_memory(memory), _run_id()
    await mem.aappend(f"{run}-gone", [Message.user("x")])
    await mem.aappend(f"{run}-kept", [Message.user("y")])
    await mem.aclear(f"{run}-gone")
    assert await mem.aload(f"{run}-gone") == [], "clear left messages behind"
    assert await mem.aload(f"{run}-kept") == [Message.user("y")], "clear touched another id"
    await mem.aclear(f"{run}-never-stored")  # clearing nothing is no error


async def callers_cannot_change_stored_history(memory: Any) -> None:
    mem, cid = as_memory(memory), _run_id()
    turn = [Message.user("original")]
    await mem.aappend(cid, turn)
    turn.append(Message.assistant("added after append"))
    loaded = await mem.aload(cid)
    loaded.append(Message.assistant("added after load"))
    assert await mem.aload(cid) == [Message.user("original")], "stored history was aliased"


async def concurrent_appends_lose_nothing(memory: Any) -> None:
    mem, run = as_memory(memory), _run_id()
    await asyncio.gather(*(mem.aappend(f"{run}-{i}", [Message.user(str(i))]) for i in range(8)))
    for i in range(8):
        assert await mem.aload(f"{run}-{i}") == [Message.user(str(i))], f"lost append {i}"


async def agent_remembers_and_trims_what_it_sends(memory: Any) -> None:
    model, cid = RecordingModel(), _run_id()
    agent = Agent(model, memory=memory, conversation_id=cid)
    for text in ("one", "two", "three"):
        await agent.agenerate(text)
    users = [m.text for m in model.sent[-1] if m.role == MessageRole.USER]
    assert users == ["one", "two", "three"], f"the agent sent {users} with the third prompt"
    await agent.agenerate("four", keep_last_turns=1)
    users = [m.text for m in model.sent[-1] if m.role == MessageRole.USER]
    assert users == ["three", "four"], f"keep_last_turns=1 sent {users}"
    stored = await as_memory(memory).aload(cid)
    assert len(stored) == 8, f"the memory holds {len(stored)} messages after 4 turns, not 8"


CHECKS: dict[str, Check] = {
    check.__name__: check
    for check in (
        unknown_conversation_loads_empty,
        turn_round_trips_exactly,
        appends_accumulate_in_order,
        awkward_ids_work_and_stay_isolated,
        clear_removes_only_that_conversation,
        callers_cannot_change_stored_history,
        concurrent_appends_lose_nothing,
        agent_remembers_and_trims_what_it_sends,
    )
}
"""Every check by name."""


async def acheck_memory(memory: ConversationMemory | Any) -> None:
    """Run every check against ``memory``; the first failure raises AssertionError."""
    for check in CHECKS.values():
        await check(memory)


def check_memory(memory: ConversationMemory | Any) -> None:
    """Blocking :func:`acheck_memory`."""
    run_sync(acheck_memory(memory))

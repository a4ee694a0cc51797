"""``ctx.schedule`` of an in-process Agent: on Redis memory it stores scheduled turns in
that Redis (for its workers), one per schedule of a call; on in-memory or file memory (or
none) it is refused, naming ``ctx.schedule``."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from convoq import Agent, Message, RunContext, ToolCall, tool
from convoq.errors import ConvoqError, InvalidScheduleError
from convoq.memory import FileConversationMemory, InMemoryConversationMemory
from convoq.memory.redis import RedisConversationMemory
from convoq.models import ModelRequest, ScriptedModel
from convoq.redis import TurnProtocol


@tool
async def plan(ctx: RunContext[Any]) -> str:
    """Schedules two follow-ups."""
    first = await ctx.schedule("tomorrow", delay_s=86_400)
    second = await ctx.schedule("next week", delay_s=7 * 86_400, agent="weekly")
    return f"{first} {second}"


def _model(request: ModelRequest) -> str | Message:
    if request.messages[-1].role == "tool":
        return request.messages[-1].text
    return Message.assistant("", [ToolCall(id="p1", name="plan", arguments={})])


async def test_on_redis_memory_the_follow_ups_are_scheduled_turns(
    redis_url: str, key_prefix: str, proto: TurnProtocol
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    agent = Agent(ScriptedModel(_model), name="daily", tools=[plan], memory=memory)
    try:
        response = await agent.agenerate("plan my week", conversation_id="c1")
    finally:
        await memory.aclose()
    first, second = response.text.split()
    waiting = await proto.scheduled_turns("c1")
    assert [(s.turn_id, s.record.agent, s.record.input.text) for s in waiting] == [
        (first, "daily", "tomorrow"),
        (second, "weekly", "next week"),
    ]
    assert waiting[0].record.status == "scheduled"


def _refusing_model(request: ModelRequest) -> str | Message:
    if request.messages[-1].role == "tool":
        return request.messages[-1].text
    return Message.assistant("", [ToolCall(id="p1", name="try_plan", arguments={})])


@tool
async def try_plan(ctx: RunContext[Any]) -> str:
    """Reports how ctx.schedule was refused."""
    try:
        await ctx.schedule("later", delay_s=60)
    except Exception as exc:
        return f"{type(exc).__name__} {exc.details.get('option')}"  # type: ignore[attr-defined]
    return "scheduled"


@pytest.mark.parametrize("kind", ["in-memory", "file", "no memory"])
def test_without_durable_timers_ctx_schedule_is_refused(kind: str, tmp_path: Path) -> None:
    memory: Any = {
        "in-memory": InMemoryConversationMemory(),
        "file": FileConversationMemory(tmp_path),
        "no memory": None,
    }[kind]
    agent = Agent(ScriptedModel(_refusing_model), name="bot", tools=[try_plan], memory=memory)
    cid = None if memory is None else "c1"
    assert agent.generate("hi", conversation_id=cid).text == "ConvoqError ctx.schedule"


async def test_a_schedule_sent_again_with_its_key_finds_the_first_turn(proto: TurnProtocol) -> None:
    from convoq.context import ScheduleRequest
    from convoq.redis._scheduling import store_scheduler

    schedule = store_scheduler(proto)
    request = ScheduleRequest("c1", "later", "daily", 60.0, "convoq-key:schedule:0")
    first = await schedule(request)
    assert await schedule(request) == first  # a rerun of the tool call
    other = await schedule(ScheduleRequest("c1", "later", "daily", 60.0, "convoq-key:schedule:1"))
    assert other != first
    assert [s.turn_id for s in await proto.scheduled_turns("c1")] == sorted([first, other])


@tool
async def at_noon(ctx: RunContext[Any]) -> str:
    """Schedules a follow-up at an instant, then tries one with no time at all."""
    noon = datetime(2099, 1, 1, 12, 0, tzinfo=UTC)
    turn_id = await ctx.schedule("at noon", not_before=noon)
    try:
        await ctx.schedule("whenever")
    except InvalidScheduleError as exc:
        return f"{turn_id} refused: {exc.message}"
    return f"{turn_id} scheduled twice"


async def test_a_follow_up_may_be_due_at_an_instant_and_needs_a_time(
    redis_url: str, key_prefix: str, proto: TurnProtocol
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    model = ScriptedModel(
        lambda r: (
            r.messages[-1].text
            if r.messages[-1].role == "tool"
            else Message.assistant("", [ToolCall(id="n1", name="at_noon", arguments={})])
        )
    )
    agent = Agent(model, name="daily", tools=[at_noon], memory=memory)
    try:
        response = await agent.agenerate("remind me", conversation_id="c2")
    finally:
        await memory.aclose()
    turn_id, _, refusal = response.text.partition(" refused: ")
    assert "delay_s= or not_before=" in refusal
    (waiting,) = await proto.scheduled_turns("c2")  # the one with a time, nothing else
    noon_ms = int(datetime(2099, 1, 1, 12, 0, tzinfo=UTC).timestamp() * 1000)
    assert (waiting.turn_id, waiting.due_ms, waiting.record.input.text) == (
        turn_id, noon_ms, "at noon",
    )  # fmt: skip


@tool
def plan_sync(ctx: RunContext[Any]) -> str:
    """A sync tool (run on a thread of its own) schedules a follow-up."""
    return ctx.schedule_sync("tomorrow, from a sync tool", delay_s=86_400)


@tool
async def plan_on_the_loop(ctx: RunContext[Any]) -> str:
    """An async tool that calls the sync variant: it would wait on its own loop."""
    try:
        ctx.schedule_sync("never", delay_s=60)
    except ConvoqError as exc:
        return f"refused: {exc.message}"
    return "scheduled"


@pytest.mark.parametrize("tool_name", ["plan_sync", "plan_on_the_loop"])
async def test_a_sync_tool_schedules_through_the_turns_loop(
    redis_url: str, key_prefix: str, proto: TurnProtocol, tool_name: str
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    model = ScriptedModel(
        lambda r: (
            r.messages[-1].text
            if r.messages[-1].role == "tool"
            else Message.assistant("", [ToolCall(id="s1", name=tool_name, arguments={})])
        )
    )
    agent = Agent(model, name="daily", tools=[plan_sync, plan_on_the_loop], memory=memory)
    try:
        response = await agent.agenerate("plan", conversation_id=f"c-{tool_name}")
    finally:
        await memory.aclose()
    waiting = await proto.scheduled_turns(f"c-{tool_name}")
    if tool_name == "plan_sync":
        assert [(s.turn_id, s.record.input.text) for s in waiting] == [
            (response.text, "tomorrow, from a sync tool")
        ]
    else:
        assert response.text.startswith("refused: ") and "await ctx.schedule" in response.text
        assert waiting == []


def test_a_context_made_outside_a_loop_cannot_schedule_sync() -> None:
    ctx = RunContext(conversation_id="c1", turn_id="t1", agent="a", deps=None, tool_call_id="x")
    with pytest.raises(ConvoqError, match="has none") as caught:
        ctx.schedule_sync("later", delay_s=1)
    assert caught.value.details["option"] == "ctx.schedule_sync"

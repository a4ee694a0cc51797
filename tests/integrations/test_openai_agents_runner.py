"""The OpenAI Agents SDK's Runner with a ConvoqSession, on every backend and across two
processes on one Redis, with the SDK's own ScriptedModel."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call

from convoq.integrations.openai_agents import ConvoqSession
from convoq.memory import (
    ConversationMemory,
)
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import MessageRole

ROOT = Path(__file__).resolve().parents[2]
RUN_DRIVER = ROOT / "tests" / "support" / "agents_session_run.py"
NO_TRACING = RunConfig(tracing_disabled=True)


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

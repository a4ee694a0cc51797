"""Profiles with sub-agents for worker tests (CONVOQ_AGENTS=tests.support.subagent_agents).

``boss`` calls its three sub-agents (``researcher``, ``writer``, ``critic``) in one step,
then answers with their results joined. Its instructions name the parent conversation and
turn, so its model can choose call ids whose child conversations fall in the partitions
``SPREAD`` lists (one each, when set: children on both pools of a test). Each sub-agent
answers ``<name>: <input>`` after ``SUBAGENT_SLEEP_S``; ``stall`` in the input makes the
researcher's first run hang (a test kills its worker there). Model runs are counted in the test
Redis (``{prefix}:test:sub:{what}``), with the pid and time of each child's run.
``tally`` asks ``relay`` and ``meter``, ``relay`` asks ``meter``, each model call reporting
usage; ``buyer`` asks ``cautious`` (its ``pay`` needs approval) and ``meter``. ``recurse``
calls itself until refused; ``delegator`` calls ``broken`` (its model raises)
and ``slowpoke`` (ticks a slow tool for a long time); ``impatient`` calls ``slowpoke`` and
waits 2 s at most; ``asks_pai`` calls the Pydantic AI profile ``pai_helper`` by name.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from convoq import Agent, Message, RunContext, ToolCall, tool
from convoq.integrations.pydantic_ai import durable
from convoq.models import ModelRequest, ScriptedModel
from convoq.queue.routing import partition_of
from convoq.subagents import child_ids
from convoq.usage import Usage
from tests.support.worker_agents import test_key, test_redis

SLEEP_S = float(os.environ.get("SUBAGENT_SLEEP_S", "1.5"))
PARTITIONS = int(os.environ.get("CONVOQ_PARTITIONS", "4"))


def _spread() -> list[int]:
    return [int(p) for p in os.environ.get("SPREAD", "").split(",") if p.strip()]


def parent_of(ctx: RunContext) -> str:
    return f"parent {ctx.conversation_id} {ctx.turn_id}"


def _ids_in(request: ModelRequest) -> tuple[str, str]:
    system = " ".join(m.text for m in request.messages if m.role == "system")
    found = re.search(r"parent (\S+) (\S+)", system)
    assert found is not None, system
    return found.group(1), found.group(2)


def call_ids(cid: str, tid: str, count: int) -> list[str]:
    """``count`` call ids; with SPREAD, the first ones' children in those partitions."""
    wanted = _spread()
    chosen: list[str] = []
    n = 0
    while len(chosen) < count:
        call_id = f"call_{n}"
        n += 1
        if len(chosen) < len(wanted):
            child = child_ids(cid, tid, call_id).conversation_id
            if partition_of(child, PARTITIONS) != wanted[len(chosen)]:
                continue
        chosen.append(call_id)
    return chosen


def boss_model(request: ModelRequest) -> Any:
    last = request.messages[-1]
    cid, tid = _ids_in(request)
    test_redis().incr(test_key("sub", "boss", cid))
    results = [m for m in request.messages if m.role == "tool"]
    if results:
        return " | ".join(sorted(m.text for m in results))
    ids = call_ids(cid, tid, 3)
    calls = [ToolCall(id=i, name=name, arguments={"input": f"{name} task {last.text}"})
             for i, name in zip(ids, ("researcher", "writer", "critic"), strict=True)]  # fmt: skip
    return Message.assistant("", calls)


def worker_model(name: str) -> ScriptedModel:
    def answer(request: ModelRequest) -> str:
        said = request.messages[-1].text
        r = test_redis()
        runs = r.incr(test_key("sub", "runs", said))
        started = time.time()
        if "stall" in said and name == "researcher" and runs == 1:
            r.set(test_key("sub", "stalled", said), os.getpid())
            time.sleep(120)  # killed here
        time.sleep(SLEEP_S)
        r.rpush(test_key("sub", "spans"), json.dumps([said, os.getpid(), started, time.time()]))
        return f"{name}: {said}"

    return ScriptedModel(answer, name=name)


researcher = Agent(worker_model("researcher"), name="researcher")
writer = Agent(worker_model("writer"), name="writer")
critic = Agent(worker_model("critic"), name="critic")
boss = Agent(
    ScriptedModel(boss_model),
    parent_of,
    name="boss",
    subagents=[researcher, writer, "critic"],  # an agent or a profile name
)


def recurse_model(request: ModelRequest) -> Any:
    results = [m for m in request.messages if m.role == "tool"]
    if results:
        return f"up({results[-1].text})"
    return Message.assistant("", [ToolCall(id="deeper", name="recurse",
                                           arguments={"input": "go deeper"})])  # fmt: skip


recurse = Agent(ScriptedModel(recurse_model), name="recurse", subagents=["recurse"])


def broken_model(request: ModelRequest) -> str:
    raise RuntimeError("the broken model fails")


@tool
def tick() -> str:
    """Wait a little."""
    time.sleep(0.3)
    return "tick"


def slow_model(request: ModelRequest) -> Any:
    n = sum(1 for m in request.messages if m.role == "tool")
    return Message.assistant("", [ToolCall(id=f"t{n}", name="tick", arguments={})])


broken = Agent(ScriptedModel(broken_model), name="broken")
slowpoke = Agent(ScriptedModel(slow_model), name="slowpoke", tools=[tick], max_steps=200)


def delegator_model(request: ModelRequest) -> Any:
    results = [m for m in request.messages if m.role == "tool"]
    if results:
        return " | ".join(m.text for m in results)
    name = "broken" if "broken" in request.messages[-1].text else "slowpoke"
    return Message.assistant("", [ToolCall(id="d1", name=name, arguments={"input": "work"})])


delegator = Agent(ScriptedModel(delegator_model), name="delegator", subagents=[broken, slowpoke])
# Waits at most 2 s for its children (its approval ttl bounds every wait of its turns).
impatient = Agent(ScriptedModel(delegator_model), name="impatient", subagents=[slowpoke],
                  approval_ttl_s=2)  # fmt: skip


def _pai_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart("pai says hi")])


# A Pydantic AI profile as a convoq agent's sub-agent, named by profile.
pai_helper = durable(PydanticAgent(FunctionModel(_pai_answer), name="pai_helper"))


def asks_pai_model(request: ModelRequest) -> Any:
    results = [m.text for m in request.messages if m.role == "tool"]
    if results:
        return f"heard: {results[0]}"
    return Message.assistant("", [ToolCall(id="p1", name="pai_helper", arguments={"input": "hi"})])


asks_pai = Agent(ScriptedModel(asks_pai_model), name="asks_pai", subagents=["pai_helper"])


# Usage: ``tally`` (two model calls, 101 and 220 tokens) asks ``meter`` (one call, 15
# tokens) and ``relay`` (one call, 30 tokens), which asks ``meter`` in turn.
def _used(total: int, prompt: int) -> Usage:
    return Usage(prompt_tokens=prompt, completion_tokens=total - prompt, total_tokens=total)


def meter_model(request: ModelRequest) -> Any:
    return Message.assistant("metered", usage=_used(15, 10))


def asking(first: ToolCall, used: tuple[Usage, Usage]) -> Any:
    def model(request: ModelRequest) -> Any:
        results = [m.text for m in request.messages if m.role == "tool"]
        if results:
            return Message.assistant(" + ".join(results), usage=used[1])
        calls = [first] if first.name == "meter" else [first, ToolCall(
            id="m2", name="meter", arguments={"input": "count"})]  # fmt: skip
        return Message.assistant("", calls, usage=used[0])

    return model


meter = Agent(ScriptedModel(meter_model), name="meter")
relay = Agent(ScriptedModel(asking(ToolCall(id="r1", name="meter", arguments={"input": "count"}),
                                   (_used(10, 8), _used(20, 12)))),
              name="relay", subagents=[meter])  # fmt: skip
tally = Agent(ScriptedModel(asking(ToolCall(id="t1", name="relay", arguments={"input": "count"}),
                                   (_used(101, 100), _used(220, 200)))),
              name="tally", subagents=[relay, meter])  # fmt: skip


# Approval: ``buyer`` asks ``cautious`` and ``meter`` at once; ``cautious`` calls ``pay``,
# which needs a person's approval (its child turn parks for it), then answers its result.
@tool(requires_approval=True)
def pay(ctx: RunContext, amount: int) -> str:
    """Pay (needs a person's approval); counted once per idempotency key in the test Redis."""
    r = test_redis()
    r.rpush(test_key("sub", "pay_calls", ctx.conversation_id or ""), ctx.idempotency_key)
    r.sadd(test_key("sub", "pay_effects", ctx.conversation_id or ""), ctx.idempotency_key)
    return f"paid {amount}"


def cautious_model(request: ModelRequest) -> Any:
    results = [m.text for m in request.messages if m.role == "tool"]
    if results:
        return results[0]
    return Message.assistant("", [ToolCall(id="p", name="pay", arguments={"amount": 3})])


def buyer_model(request: ModelRequest) -> Any:
    results = [m.text for m in request.messages if m.role == "tool"]
    if results:
        return " + ".join(results)
    calls = [ToolCall(id="b1", name="cautious", arguments={"input": "buy"}),
             ToolCall(id="b2", name="meter", arguments={"input": "count"})]  # fmt: skip
    return Message.assistant("", calls)


cautious = Agent(ScriptedModel(cautious_model), name="cautious", tools=[pay])
buyer = Agent(ScriptedModel(buyer_model), name="buyer", subagents=[cautious, meter])


# One step, two kinds of wait: ``mixed`` calls ``pay`` (a person decides it) and asks
# ``meter`` (a child turn decides it) at once, then answers both results.
def mixed_model(request: ModelRequest) -> Any:
    results = [m.text for m in request.messages if m.role == "tool"]
    if results:
        return " + ".join(results)
    calls = [ToolCall(id="x1", name="pay", arguments={"amount": 5}),
             ToolCall(id="x2", name="meter", arguments={"input": "count"})]  # fmt: skip
    return Message.assistant("", calls)


mixed = Agent(ScriptedModel(mixed_model), name="mixed", tools=[pay], subagents=[meter])

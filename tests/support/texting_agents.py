"""Profiles for the double-texting tests (CONVOQ_AGENTS=tests.support.texting_agents).

``texter`` reads the turn's user message (all its text parts, joined by spaces):

- with ``[hold]`` its first model call says so (the test Redis list ``held`` gets the
  text) and then waits until the test pushes onto the list ``gate:<text>`` (60 s at most), so the
  turn is reliably running when the test sends the next message;
- with ``[tool]`` that first call asks for the tool ``lookup`` (each run of which the
  list ``lookups`` records); with ``[approve]`` for ``refund``, which needs approval;
  with ``[holdtool]`` for both in one step, ``lookup`` held as the model call is above;
- otherwise it answers ``re: <text> | seen: <every user text it was sent, oldest first>``
  with ``| files: <mime:name>, ...`` for the attachments of the last user message.

``pai-texter`` is a Pydantic AI agent (its FunctionModel) that does the same with ``[hold]``
and ``[tool]`` (its tool: ``pai_lookup``).
"""

from __future__ import annotations

import asyncio

from pydantic_ai import Agent as PaiAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart, UserPromptPart
from pydantic_ai.messages import ModelRequest as PaiRequest
from pydantic_ai.messages import TextPart as PaiText
from pydantic_ai.models.function import AgentInfo, FunctionModel

from convoq import Agent, Message, ToolCall, tool
from convoq.integrations.pydantic_ai import durable
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel
from tests.support.worker_agents import test_key, test_redis

GATE_S = 60


def held(text: str) -> None:
    """Say ``text`` is held (list ``held``), then wait for ``gate:<text>`` (60 s at most)."""
    test_redis().rpush(test_key("held"), text)
    gate = test_key("gate", text)
    for _ in range(GATE_S):  # short blocks: the test client's reply timeout is short
        if test_redis().blpop([gate], timeout=1):
            break


@tool
def lookup(query: str) -> str:
    """Look something up."""
    if "[holdtool]" in query:
        held(query)
    test_redis().rpush(test_key("lookups"), query)
    return f"found {query}"


@tool(requires_approval=True)
def refund(order: str) -> str:
    """Refund an order (needs a person's approval)."""
    test_redis().rpush(test_key("refunds"), order)
    return f"refunded {order}"


def said(message: Message) -> str:
    return " ".join(p.text for p in message.content if hasattr(p, "text"))


def texter_fn(request: ModelRequest) -> Message:
    users = [m for m in request.messages if m.role == MessageRole.USER]
    text = said(users[-1])
    first_call = request.messages[-1].role == MessageRole.USER
    if first_call and "[hold]" in text:
        held(text)
    if first_call and "[holdtool]" in text:  # two calls in one step: one runs, one parks
        calls = [ToolCall(id="call-1", name="lookup", arguments={"query": text}),
                 ToolCall(id="call-2", name="refund", arguments={"order": "o-2"})]  # fmt: skip
        return Message.assistant("both", calls)
    if first_call and "[tool]" in text:
        return Message.assistant("looking", [ToolCall(id="call-1", name="lookup",
                                                      arguments={"query": text})])  # fmt: skip
    if first_call and "[approve]" in text:
        return Message.assistant("", [ToolCall(id="call-2", name="refund",
                                               arguments={"order": "o-1"})])  # fmt: skip
    files = [f"{p.mime_type}:{getattr(p, 'filename', None)}" for p in users[-1].attachments]
    answer = f"re: {text} | seen: {' / '.join(said(u) for u in users)}"
    return Message.assistant(answer + (f" | files: {', '.join(files)}" if files else ""))


texter = Agent(ScriptedModel(texter_fn), name="texter", tools=[lookup, refund])


# -- a Pydantic AI profile, the same behaviour -----------------------------------------
async def pai_fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    prompts = [p.content for m in messages if isinstance(m, PaiRequest) for p in m.parts
               if isinstance(p, UserPromptPart) and isinstance(p.content, str)]  # fmt: skip
    text, last = prompts[-1], messages[-1]
    first_call = any(isinstance(p, UserPromptPart) for p in getattr(last, "parts", []))
    if first_call and "[hold]" in text:
        test_redis().rpush(test_key("held"), text)
        gate = test_key("gate", text)
        for _ in range(GATE_S * 10):  # the loop stays free: the lease is renewed meanwhile
            if test_redis().lpop(gate):
                break
            await asyncio.sleep(0.1)
    if first_call and "[tool]" in text:
        return ModelResponse(parts=[ToolCallPart("pai_lookup", {"query": text}, "pai-1")])
    return ModelResponse(parts=[PaiText(f"re: {text} | seen: {' / '.join(prompts)}")])


pai_agent: PaiAgent[None, str] = PaiAgent(FunctionModel(pai_fn), name="pai-texter")


@pai_agent.tool_plain
def pai_lookup(query: str) -> str:
    """Look something up."""
    test_redis().rpush(test_key("lookups"), query)
    return f"found {query}"


pai_texter = durable(pai_agent)

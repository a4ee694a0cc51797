"""The profiles of the cross-feature matrix (CONVOQ_AGENTS=tests.support.matrix_agents).

One convoq ``Agent`` and one Pydantic AI agent per model wire, all on the three-wire
loopback server at ``MATRIX_WIRE_URL`` (``.../v1``, :mod:`tests.support.wire_server`):
``convoq_chat``, ``convoq_responses``, ``convoq_anthropic``, ``pydantic_ai_chat``,
``pydantic_ai_responses``, ``pydantic_ai_anthropic``. Each has the same tools: ``refund``
(needs approval), ``whoami`` (reads the turn's metadata), ``ship`` (its result comes later
from outside: convoq's or Pydantic AI's ``CallDeferred``) and, for convoq agents, the MCP
test server's ``t__add``; and the same guardrails: ``no_blocked_input`` trips on a user
message of the ``input_guardrail`` rider, ``no_blocked_output`` on an answer of the
``output_guardrail`` rider. Each convoq agent hands off to ``desk_<wire>`` (on the same
wire) for the ``handoff`` rider. What each model answers is :func:`script`, read from the
request (and, for the ``retry`` rider, from :data:`BROKEN` in the process serving the wire;
for the ``merge`` rider, the first turn's model call is held at a gate of :data:`HELD`).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import CallDeferred as PydanticCallDeferred
from pydantic_ai import RunContext as PydanticContext
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

from convoq import Agent, CallDeferred, GuardrailResult, Message, RunContext, tool
from convoq.integrations.pydantic_ai import DurableAgent, durable
from convoq.mcp import stdio_server
from convoq.models import anthropic, openai, responses
from tests.support.mcp_servers import stdio_args
from tests.support.wire_server import Said, Seen

URL = os.environ.get("MATRIX_WIRE_URL", "http://127.0.0.1:9/v1")
ROOT = URL.removesuffix("/v1")
WIRES = ("chat", "responses", "anthropic")
MARK = "cell:"
ANSWER = {"answer": "forty-two", "n": 42}
WRONG = {"answer": 42}  # n missing, answer not a string: fails the output schema
MCP_LOG = os.environ.get("MATRIX_MCP_LOG", "/tmp/convoq-matrix-mcp.log")
# Conversations of the retry rider whose model refuses its answer after the tool result
# (HTTP 400: the turn fails after its first step); the test takes a conversation out to
# let its retried turn succeed. Read where the wire server runs: the test's process.
BROKEN: set[str] = set()
# Conversations of the merge rider whose first turn's model call is held: the server sets
# the first event when the call arrives and answers once the test sets the second.
HELD: dict[str, tuple[threading.Event, threading.Event]] = {}
HOLD_S = 60.0


def rider_of(seen: Seen) -> tuple[str, list[Any]]:
    """The cell's rider named in the current turn's user message, and what followed it."""
    marked, after = seen.since(MARK)
    if marked is None:
        return "", []
    return marked.text.split(MARK, 1)[1].split()[0], after


def script(seen: Seen) -> Said:
    """The model of every cell: call the rider's tool once, then answer."""
    rider, after = rider_of(seen)
    results = [item for item in after if item.role == "tool"]
    if rider == "summarise":
        return Said("users said hello")  # the summariser's answer
    if rider == "merge":
        return _merge(seen)
    if rider == "typed_output":
        tried = any(item.role == "assistant" for item in after)
        return Said(output=ANSWER if tried else WRONG)
    tool = {"approval": ("refund", {"amount": 5}), "metadata": ("whoami", {}),
            "mcp": ("t__add", {"a": 2, "b": 3}), "retry": ("whoami", {}),
            "subagent": ("helper", {"input": "help me"}),
            "handoff": (f"transfer_to_desk_{seen.wire}", {}),
            "deferred": ("ship", {"order": "A7"})}.get(rider)  # fmt: skip
    if tool is not None and not results:
        return Said(calls=[(f"call_{rider}", tool[0], tool[1])])
    if rider == "retry" and _cid_of(seen) in BROKEN:
        return Said("the model API refuses this request", error=400)
    if results:
        return Said(f"{rider} done: {results[-1].text}")
    return Said(f"{rider or 'plain'} ok")


def _merge(seen: Seen) -> Said:
    """The merge rider: its first turn (the message saying "hold") waits at its gate, so
    the messages sent meanwhile find the conversation busy; the merged turn answers."""
    marked, _ = seen.since(MARK)
    gate = HELD.get(_cid_of(seen))
    if marked is not None and "hold" in marked.text.split() and gate is not None:
        entered, go = gate
        entered.set()
        go.wait(HOLD_S)
        return Said("merge held")
    return Said("merge ok")


def _cid_of(seen: Seen) -> str:
    """The conversation id a cell's user message names after its rider."""
    marked, _ = seen.since(MARK)
    words = marked.text.split(MARK, 1)[1].split() if marked is not None else []
    return words[1] if len(words) > 1 else ""


def convoq_model(wire: str) -> Any:
    if wire == "chat":
        return openai("gpt-m", base_url=URL, api_key="k")
    if wire == "responses":
        return responses("gpt-m", base_url=URL, api_key="k")
    return anthropic("claude-m", base_url=ROOT, api_key="k")


def pydantic_ai_model(wire: str) -> Any:
    if wire == "chat":
        return OpenAIChatModel("gpt-m", provider=OpenAIProvider(base_url=URL, api_key="k"))
    if wire == "responses":
        return OpenAIResponsesModel("gpt-m", provider=OpenAIProvider(base_url=URL, api_key="k"))
    return AnthropicModel("claude-m", provider=AnthropicProvider(base_url=ROOT, api_key="k"))


@tool(requires_approval=True)
def refund(amount: int) -> str:
    """Refund an amount to the customer."""
    return f"refunded {amount}"


@tool
def ship(order: str) -> str:
    """Hand the order to the carrier, who reports the tracking later."""
    raise CallDeferred(metadata={"order": order})


@tool
def whoami(ctx: RunContext) -> str:
    """The customer this turn is for."""
    return str(ctx.metadata.get("customer"))


def no_blocked_input(ctx: RunContext, message: Message) -> GuardrailResult:
    if f"{MARK}input_guardrail" in message.text:
        return GuardrailResult.trip(f"blocked input of {ctx.conversation_id}")
    return GuardrailResult.passed()


async def no_blocked_output(ctx: RunContext, answer: Any) -> GuardrailResult:
    if isinstance(answer, str) and answer.startswith("output_guardrail"):
        return GuardrailResult.trip(f"blocked output of {ctx.conversation_id}")
    return GuardrailResult.passed()


GUARDRAILS: dict[str, Any] = {
    "input_guardrails": [no_blocked_input],
    "output_guardrails": [no_blocked_output],
}


def _convoq(wire: str) -> Agent:
    # Its sub-agent, on the same wire: asked without the cell's mark, it answers "plain ok".
    helper = Agent(convoq_model(wire), "Be brief.", name=f"helper_{wire}")
    desk = Agent(convoq_model(wire), "You are the desk.", name=f"desk_{wire}")
    return Agent(
        convoq_model(wire),
        "Be brief.",
        name=f"convoq_{wire}",
        tools=[refund, whoami, ship],
        mcp_servers=[stdio_server("t", **stdio_args(MCP_LOG))],
        subagents=[helper.as_tool(name="helper", description="Helps.")],
        handoffs=[desk],
        **GUARDRAILS,
    )


def _pydantic_ai(wire: str) -> DurableAgent:
    agent: PydanticAgent[Any, Any] = PydanticAgent(
        pydantic_ai_model(wire), name=f"pydantic_ai_{wire}", instructions="Be brief."
    )

    @agent.tool_plain(requires_approval=True)
    def refund(amount: int) -> str:
        """Refund an amount to the customer."""
        return f"refunded {amount}"

    @agent.tool
    def whoami(ctx: PydanticContext[Any]) -> str:
        """The customer this turn is for."""
        return str((ctx.metadata or {}).get("customer"))

    @agent.tool_plain
    def ship(order: str) -> str:
        """Hand the order to the carrier, who reports the tracking later."""
        raise PydanticCallDeferred(metadata={"order": order})

    return durable(agent, **GUARDRAILS)


convoq_chat = _convoq("chat")
convoq_responses = _convoq("responses")
convoq_anthropic = _convoq("anthropic")
pydantic_ai_chat = _pydantic_ai("chat")
pydantic_ai_responses = _pydantic_ai("responses")
pydantic_ai_anthropic = _pydantic_ai("anthropic")

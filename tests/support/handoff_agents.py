"""Profiles that hand off, for worker tests (CONVOQ_AGENTS=tests.support.handoff_agents).

``triage`` hands the turn to ``billing`` when the user mentions billing, else answers
``triage: <text>``; ``billing`` answers ``billing: <text>`` (an output guardrail blocks an
answer saying ``forbidden``) and hands back to ``triage`` when asked to go ``back``. Both
name their targets only, so a worker may serve one of them: ``HANDOFF_SERVE`` (``triage``
or ``billing``; unset: both). Every model call is counted in the test Redis
(``{prefix}:test:handoff:{agent}:{cid}``) with the pid that made it (``...:pids``).
``kill-tool`` in the text makes triage's handoff step also call ``note``, which kills its
worker the first time (after the handoff's result was journaled); ``kill-billing`` kills
billing's worker in its first model call.
"""

from __future__ import annotations

import os
import signal

from convoq import Agent, GuardrailResult, Message, RunContext, ToolCall, tool
from convoq.models import ModelRequest, ScriptedModel
from tests.support.worker_agents import test_key, test_redis

SERVE = os.environ.get("HANDOFF_SERVE", "")


def _count(agent: str, request: ModelRequest) -> tuple[str, int]:
    users = [m for m in request.messages if m.role == "user"]
    text = users[-1].text
    cid = text.split("|")[0]
    r = test_redis()
    r.rpush(test_key("handoff", agent, cid, "pids"), os.getpid())
    return text, int(r.incr(test_key("handoff", agent, cid)))


def _first(what: str) -> bool:
    return bool(test_redis().set(test_key("handoff", "once", what), "1", nx=True))


@tool
def note(text: str) -> str:
    """Notes something."""
    if _first(f"note:{text}"):
        os.kill(os.getpid(), signal.SIGKILL)
    return "noted"


def triage_model(request: ModelRequest) -> object:
    text, _ = _count("triage", request)
    last = request.messages[-1]
    if last.role == "user" and "billing" in text:
        calls = [ToolCall(id="h", name="transfer_to_billing", arguments={})]
        if "kill-tool" in text:
            calls.append(ToolCall(id="n", name="note", arguments={"text": text}))
        return Message.assistant("", calls)
    return f"triage: {text}"


def billing_model(request: ModelRequest) -> object:
    text, _ = _count("billing", request)
    if "kill-billing" in text and _first(f"billing:{text}"):
        os.kill(os.getpid(), signal.SIGKILL)
    if "back" in text and request.messages[-1].role == "user":
        return Message.assistant("", [ToolCall(id="b", name="transfer_to_triage", arguments={})])
    return f"billing: {text}"


def no_forbidden(ctx: RunContext, answer: object) -> GuardrailResult:
    return GuardrailResult(tripped="forbidden" in str(answer), reason="says forbidden")


if SERVE in ("", "triage"):
    triage = Agent(
        ScriptedModel(triage_model), "You route.", name="triage",
        tools=[note], handoffs=["billing"],
    )  # fmt: skip
if SERVE in ("", "billing"):
    billing = Agent(
        ScriptedModel(billing_model), "You do billing.", name="billing",
        handoffs=["triage"], output_guardrails=[no_forbidden],
    )  # fmt: skip

"""RunContext in process: what a tool, instructions and an approval policy see (sync,
async and streamed calls), deps and their factory, per-call metadata, idempotency keys
that hold across a resume, and clear errors for bad input."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from convoq import Agent, Decision, Message, RunContext, ToolCall, tool
from convoq.context import MAX_METADATA_BYTES, idempotency_key
from convoq.errors import ConvoqError, ToolError
from convoq.memory import InMemoryConversationMemory
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Bank:
    """An application's deps: a ledger that dedupes payments by key."""

    ledger: dict[str, int] = field(default_factory=dict)
    contexts: list[RunContext[Any]] = field(default_factory=list)


@tool(requires_approval=lambda ctx, args: args["amount"] > 100)
def pay(ctx: RunContext[Bank], amount: int) -> str:
    """Pay an amount."""
    ctx.deps.contexts.append(ctx)
    ctx.deps.ledger.setdefault(ctx.idempotency_key, amount)
    return f"paid {amount}"


def payer(request: ModelRequest) -> str | Message:
    """Pays the amount the user wrote, then repeats its system prompt and the result."""
    last = request.messages[-1]
    system = request.messages[0].text if request.messages[0].role == MessageRole.SYSTEM else ""
    if last.role == MessageRole.TOOL:
        return f"{system} | {last.text}"
    call = ToolCall(id="p1", name="pay", arguments={"amount": int(last.text)})
    return Message(role=MessageRole.ASSISTANT, tool_calls=[call])


def greet(ctx: RunContext[Bank]) -> str:
    return f"Greet {ctx.metadata.get('user', 'nobody')} (step {ctx.step})."


def agent(**kwargs: Any) -> Agent:
    kwargs.setdefault("deps", Bank())
    return Agent(ScriptedModel(payer), greet, tools=[pay], name="bank", **kwargs)


def test_the_context_schema_and_instructions_of_a_sync_call() -> None:
    bank = Bank()
    a = agent(deps=bank, memory=InMemoryConversationMemory(), conversation_id="c1")
    assert "ctx" not in a.tools.get("pay").spec.parameters["properties"]
    response = a.generate("7", metadata={"user": "ada"})
    assert response.text == "Greet ada (step 1). | paid 7"
    [ctx] = bank.contexts
    assert (ctx.conversation_id, ctx.agent, ctx.tool_call_id, ctx.tool_name) == (
        "c1", "bank", "p1", "pay"
    )  # fmt: skip
    assert (ctx.attempt, ctx.step, ctx.metadata) == (1, 1, {"user": "ada"})
    assert ctx.idempotency_key == idempotency_key("c1", ctx.turn_id, 1, "p1")
    assert ctx.idempotency_key.startswith("convoq-") and len(ctx.turn_id) == 32
    assert ctx.usage.requests == 1
    assert bank.ledger == {ctx.idempotency_key: 7}
    # Another turn, another key; no metadata, {}.
    assert a.generate("8").text == "Greet nobody (step 1). | paid 8"
    assert bank.contexts[1].idempotency_key != ctx.idempotency_key
    assert bank.contexts[1].metadata == {}


async def test_async_instructions_and_an_async_tool_in_agenerate() -> None:
    seen: list[RunContext[str]] = []

    async def instructions(ctx: RunContext[str]) -> str:
        await asyncio.sleep(0)
        return f"deps={ctx.deps}"

    @tool
    async def pay(ctx: RunContext[str], amount: int) -> str:
        seen.append(ctx)
        return f"paid {amount}"

    a = Agent(ScriptedModel(payer), instructions, tools=[pay], deps="the-db")
    response = await a.agenerate("3", metadata={"n": 1})
    assert response.text == "deps=the-db | paid 3"
    assert seen[0].metadata == {"n": 1} and seen[0].conversation_id is None


def test_a_tool_changing_its_metadata_changes_no_other_call() -> None:
    seen: list[dict[str, Any]] = []

    @tool
    def meddle(ctx: RunContext[None]) -> str:
        seen.append(dict(ctx.metadata))
        ctx.metadata["user"] = "mallory"
        return "ok"

    def twice(request: ModelRequest) -> str | Message:
        calls = [ToolCall(id=f"m{n}", name="meddle") for n in (1, 2)]
        done = request.messages[-1].role == MessageRole.TOOL
        return "done" if done else Message(role=MessageRole.ASSISTANT, tool_calls=calls)

    Agent(ScriptedModel(twice), tools=[meddle]).generate("go", metadata={"user": "ada"})
    assert seen == [{"user": "ada"}, {"user": "ada"}]


def test_a_stream_carries_the_metadata_to_its_tools() -> None:
    bank = Bank()
    events = list(agent(deps=bank).stream("9", metadata={"user": "bo"}))
    assert events[-1].data["text"] == "Greet bo (step 1). | paid 9"
    assert bank.contexts[0].metadata == {"user": "bo"}


def test_a_resumed_call_keeps_its_context_key_and_records_who_decided() -> None:
    bank = Bank()
    a = agent(deps=bank, memory=InMemoryConversationMemory(), conversation_id="c2")
    paused = a.generate("500", metadata={"user": "cy"})
    assert paused.status == "awaiting_approval" and bank.contexts == []
    assert paused.continuation is not None
    token = paused.continuation.token
    with pytest.raises(ConvoqError, match="by must name"):
        a.resume(paused.continuation, {"p1": True}, by="")
    done = a.resume(paused.continuation.model_dump_json(), {"p1": True}, by="alice")
    assert done.text == "Greet cy (step 1). | paid 500"
    [ctx] = bank.contexts
    assert ctx.turn_id == token and ctx.metadata == {"user": "cy"}
    assert ctx.idempotency_key == idempotency_key("c2", token, 1, "p1")
    tool_result = done.turn[2]
    assert tool_result.decision is not None
    assert (tool_result.decision.by, tool_result.decision.approved) == ("alice", True)
    assert tool_result.decision.at_ms is not None


def test_a_denied_call_tells_the_model_who_denied_it_and_why() -> None:
    a = agent()
    paused = a.generate("900")
    assert paused.continuation is not None
    decision = Decision(approved=False, reason="over budget")
    done = a.resume(paused.continuation, {"p1": decision}, by="bob")
    assert "denied this tool call by bob: over budget. It did not run" in done.text
    assert done.turn[2].decision is not None and done.turn[2].decision.by == "bob"


def test_an_agent_policy_over_all_tools_sync_and_async() -> None:
    async def only_admins(ctx: RunContext[Bank], arguments: dict[str, Any]) -> bool:
        return ctx.tool_name == "pay" and ctx.metadata.get("role") != "admin"

    a = agent(approval_policy=only_admins)
    assert a.generate("5", metadata={"role": "admin"}).status == "completed"
    assert a.generate("5", metadata={"role": "guest"}).status == "awaiting_approval"
    sync_policy = agent(approval_policy=lambda ctx, args: args["amount"] == 6)
    assert sync_policy.generate("6").status == "awaiting_approval"
    assert sync_policy.generate("4").status == "completed"


def test_a_policy_that_raises_or_answers_no_bool_fails_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(ctx: RunContext[Any], arguments: dict[str, Any]) -> bool:
        raise RuntimeError("policy bug")

    assert agent(approval_policy=broken).generate("1").status == "awaiting_approval"
    assert "policy bug" in caplog.text
    vague = agent(approval_policy=lambda ctx, args: "yes")
    assert vague.generate("1").status == "awaiting_approval"
    assert "not a bool" in caplog.text


def test_deps_factory_is_called_once_per_process() -> None:
    made: list[int] = []

    def factory() -> Bank:
        made.append(os.getpid())
        return Bank()

    a = agent(deps=None, deps_factory=factory)
    for n in range(3):
        a.generate(str(n))
    assert made == [os.getpid()]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"deps": Bank(), "deps_factory": Bank}, "deps or deps_factory, not both"),
        ({"deps": None, "deps_factory": 3}, "deps_factory must be a function"),
        ({"approval_policy": "always"}, "approval rule is True, False or a function"),
        ({"approval_policy": lambda ctx: True}, "does not take those two arguments"),
    ],
)
def test_bad_agent_arguments_are_refused(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ConvoqError, match=words):
        agent(**kwargs)


def test_an_async_deps_factory_is_refused() -> None:
    async def factory() -> Bank:
        return Bank()

    with pytest.raises(ConvoqError, match="plain function"):
        agent(deps=None, deps_factory=factory)


def test_a_context_parameter_that_is_not_first_is_refused() -> None:
    def late(amount: int, ctx: RunContext[Bank]) -> str:
        return "x"

    with pytest.raises(ToolError, match="must come first"):
        tool(late)


def test_a_bad_tool_rule_is_refused() -> None:
    with pytest.raises(ConvoqError, match="tool 'x'"):
        tool(name="x", requires_approval=1)(lambda: "x")  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("metadata", "words"),
    [
        ([1], "JSON object"),
        ({2: "x"}, "keys must be strings"),
        ({"x": {1, 2}}, "only JSON values"),
        ({"x": "y" * MAX_METADATA_BYTES}, "over the limit"),
    ],
)
def test_bad_metadata_is_refused_before_anything_runs(metadata: Any, words: str) -> None:
    bank, memory = Bank(), InMemoryConversationMemory()
    a = agent(deps=bank, memory=memory, conversation_id="c3")
    with pytest.raises(ConvoqError, match=words):
        a.generate("1", metadata=metadata)
    with pytest.raises(ConvoqError, match=words):
        list(a.stream("1", metadata=metadata))
    assert bank.contexts == [] and memory.load("c3") == []


async def test_a_context_tool_called_without_context_says_so() -> None:
    with pytest.raises(ToolError, match="takes a RunContext"):
        await pay.call({"amount": 1})


def test_instructions_have_no_idempotency_key() -> None:
    def instructions(ctx: RunContext[None]) -> str:
        return ctx.idempotency_key

    with pytest.raises(ConvoqError, match="belongs to a tool call"):
        Agent(ScriptedModel(lambda r: "x"), instructions).generate("hi")


def test_instructions_returning_no_str_fail_clearly() -> None:
    with pytest.raises(ConvoqError, match="returned int"):
        Agent(ScriptedModel(lambda r: "x"), lambda ctx: 3).generate("hi")  # type: ignore[arg-type,return-value]


TYPED = """
from dataclasses import dataclass
from convoq import Agent, RunContext, tool
from convoq.models import ScriptedModel

@dataclass
class Deps:
    db: str

@tool
def lookup(ctx: RunContext[Deps], key: str) -> str:
    return ctx.deps.{attribute} + key

agent = Agent(ScriptedModel(lambda request: "ok"), tools=[lookup], deps=Deps(db="x"))
"""


def test_run_context_is_generic_in_its_deps_under_mypy_strict(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(textwrap.dedent(TYPED.format(attribute="db")))
    bad.write_text(textwrap.dedent(TYPED.format(attribute="nope")))
    # One run for both files, with the project's mypy cache (warm after `make lint`).
    command = [sys.executable, "-m", "mypy", "--strict", str(good), str(bad)]
    checked = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert errors and all(line.split(":")[0].endswith("bad.py") for line in errors), checked.stdout
    assert any('"Deps" has no attribute "nope"' in line for line in errors), checked.stdout

"""Where features meet: every entry point x profile x model wire x what rides on the turn.

Each cell runs a real turn: in process (a convoq ``Agent`` over Redis memory), through a
``Client`` to real worker processes, or through the HTTP gateway to them; on a convoq
``Agent`` profile or a Pydantic AI one; over Chat Completions, Responses or Anthropic
Messages, served by one loopback server speaking all three (:mod:`tests.support.wire_server`).
It then checks the requests that cell's model received and what the conversation stored.

What rides on the turn:

- ``metadata``: a tool reads the customer id submitted with the turn.
- ``model_settings``: temperature and top_p reach the wire's body.
- ``typed_output``: the first answer does not fit the schema; the retry request ends with
  the correction (never the rejected answer), and the turn's output is the typed answer.
- ``approval``: the call parks; it is approved from elsewhere and resumes on another
  worker (the one that parked it is killed first; in process, a fresh ``Agent`` resumes
  the continuation).
- ``mcp``: a tool of the MCP test server runs.
- ``summary``: a stored compaction summary is sent in place of the turns it covers.
- ``langchain_history`` / ``openai_agents_history``: the conversation so far was written
  by the LangChain and OpenAI Agents adapters; the turn succeeds, sends no framework data
  to the model, and the adapter reads back exactly what it wrote.
- ``input_guardrail`` / ``output_guardrail``: the profile's guardrail trips on the user
  message (no request reaches the model) or on the answer; the turn ends ``blocked``
  naming the guardrail and its reason, and the conversation stores nothing.
- ``retry``: the model API refuses the answer after the tool result (HTTP 400), so the
  turn fails after its first step; once the API takes it again the turn is retried (the
  client's ``retry``, the gateway's ``POST .../retry``) and succeeds as the same turn: the
  journaled model answer and tool result are not asked or run again.
- ``subagent``: the model calls its sub-agent (``helper``, a convoq agent on the same
  wire); in process it runs inline, on workers as a child turn the parent waits for; the
  child's answer is the tool result the parent's answer quotes.
- ``handoff``: the model hands the turn to ``desk_<wire>`` (a convoq agent on the same
  wire), which answers with its own instructions; the history with the handoff and the
  answering agents' names is what the next request sends, on every wire.

Cells that cannot apply are in :data:`NOT_APPLICABLE` with the reason.
"""

from __future__ import annotations

import importlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from convoq import Agent, Client, GuardrailTripped
from convoq.compaction import CompactionPolicy, compact
from convoq.memory import RedisConversationMemory
from convoq.messages import Message
from convoq.models import ScriptedModel
from convoq.summary import SUMMARY_PREFIX
from tests.support import matrix_agents
from tests.support.gateway import GatewayProcess, running_gateway, turns_path
from tests.support.redis_server import RedisServer
from tests.support.wire_server import Seen, WireServer
from tests.support.workers import WorkerPool, running_pool

pytestmark = pytest.mark.slow

ENTRIES = ("in_process", "worker", "gateway")
PROFILES = ("convoq", "pydantic_ai")
WIRES = matrix_agents.WIRES
RIDERS = ("metadata", "model_settings", "typed_output", "approval", "mcp", "summary",
          "langchain_history", "openai_agents_history", "input_guardrail",
          "output_guardrail", "retry", "subagent", "handoff")  # fmt: skip
GUARDED = {"input_guardrail": "no_blocked_input", "output_guardrail": "no_blocked_output"}
ANY = "*"
# (entry, profile, wire, rider), ANY matching every value -> why the cell cannot apply.
NOT_APPLICABLE: dict[tuple[str, str, str, str], str] = {
    ("in_process", "pydantic_ai", ANY, ANY): "a Pydantic AI agent in process is Pydantic AI's"
    " own run; convoq serves it as a worker profile (durable), so it is tested on workers",
    (ANY, "pydantic_ai", ANY, "mcp"): "MCP servers are a convoq Agent's mcp_servers; a"
    " Pydantic AI agent brings its own toolsets, which run inside its run as its tools",
    ("in_process", ANY, ANY, "retry"): "a turn that fails in process raises to its caller"
    " and leaves no turn record: only a queued turn can be retried (worker, gateway)",
    (ANY, "pydantic_ai", ANY, "handoff"): "Pydantic AI has no handoff: durable(...,"
    " handoffs=...) is refused (tests/test_handoffs.py), and only a convoq Agent profile"
    " takes a handed-off turn",
    (ANY, "pydantic_ai", ANY, "subagent"): "sub-agents are a convoq Agent's subagents; a"
    " Pydantic AI agent delegates inside its own run (its tools), and a convoq agent may"
    " name a Pydantic AI profile as its sub-agent",
}
SETTINGS = {"temperature": 0.25, "top_p": 0.5}


class Answer(BaseModel):
    answer: str
    n: int


def _not_applicable(cell: tuple[str, str, str, str]) -> str | None:
    for pattern, why in NOT_APPLICABLE.items():
        if all(p in (ANY, v) for p, v in zip(pattern, cell, strict=True)):
            return why
    return None


CELLS = [
    pytest.param(
        entry, profile, wire, rider,
        id=f"{entry}-{profile}-{wire}-{rider}",
        marks=[pytest.mark.skip(reason=why)] if (why := _not_applicable(
            (entry, profile, wire, rider))) else [],
    )
    for entry in ENTRIES for profile in PROFILES for wire in WIRES for rider in RIDERS
]  # fmt: skip


@dataclass
class Ran:
    """What a cell's turn came to, whichever way it was run."""

    status: str
    text: str = ""
    output: Any = None
    pending: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None


@pytest.fixture(scope="module")
def wire() -> Iterator[WireServer]:
    with WireServer(matrix_agents.script) as server:
        yield server


@pytest.fixture(scope="module")
def mcp_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp") / "calls.log"


@pytest.fixture(scope="module")
def pool(
    redis_server: RedisServer,
    wire: WireServer,
    mcp_log: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch_module: pytest.MonkeyPatch,
) -> Iterator[WorkerPool]:
    monkeypatch_module.setenv("MATRIX_WIRE_URL", wire.url)
    monkeypatch_module.setenv("MATRIX_MCP_LOG", str(mcp_log))
    logs = tmp_path_factory.mktemp("workers")
    with running_pool(
        redis_server.url, logs, 1, agents="tests.support.matrix_agents", lease_ms=3000
    ) as started:
        yield started


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def gateway(pool: WorkerPool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with running_gateway(pool, tmp_path_factory.mktemp("gateway")) as started:
        yield started


@pytest.fixture(scope="module")
def client(pool: WorkerPool) -> Iterator[Client]:
    with pool.client() as started:
        yield started


@pytest.fixture(scope="module")
def memory(pool: WorkerPool) -> Iterator[RedisConversationMemory]:
    yield RedisConversationMemory(pool.redis_url, prefix=pool.prefix)


@pytest.fixture(scope="module")
def agents(pool: WorkerPool) -> Any:
    """The matrix module as the test process imports it (after MATRIX_WIRE_URL is set)."""
    return importlib.reload(matrix_agents)


@pytest.fixture(scope="module")
def parked(
    request: pytest.FixtureRequest, pool: WorkerPool, memory: RedisConversationMemory
) -> dict[tuple[str, str, str], tuple[Cell, Ran]]:
    """Every worker and gateway approval cell's turn, parked on the module's first worker;
    that worker is then killed, so each of them resumes on another one."""
    turns = {}
    for entry in ("worker", "gateway"):
        for profile in PROFILES:
            for wire_name in WIRES:
                cell = Cell.new(entry, profile, wire_name, "approval", request, memory)
                turns[(entry, profile, wire_name)] = (cell, cell.run())
    first = list(pool.workers)
    pool.start(1)
    for worker in first:
        worker.kill()  # parked turns hold no worker: nothing of theirs dies with it
    assert not any(w.alive() for w in first)
    return turns


@pytest.mark.parametrize(("entry", "profile", "wire_name", "rider"), CELLS)
def test_cell(
    entry: str,
    profile: str,
    wire_name: str,
    rider: str,
    request: pytest.FixtureRequest,
    wire: WireServer,
    memory: RedisConversationMemory,
) -> None:
    if rider == "approval" and entry != "in_process":
        parked: dict[tuple[str, str, str], tuple[Cell, Ran]] = request.getfixturevalue("parked")
        cell, ran = parked[(entry, profile, wire_name)]
        written = None
    else:
        cell = Cell.new(entry, profile, wire_name, rider, request, memory)
        written = cell.seed()
        ran = cell.run()
    cid = cell.cid
    requests = [s for s in wire.seen() if any(cid in item.text for item in s.items)]
    if rider in GUARDED:
        check_blocked(cell, ran, requests)
        return
    if rider == "approval":
        assert ran.status == "awaiting_approval" and ran.pending == ["refund"], ran
        ran = cell.approve()
    if rider == "retry":
        assert ran.status == "failed", ran
        ran = cell.retry()
    assert ran.status in ("succeeded", "completed"), ran
    requests = [s for s in wire.seen() if any(cid in item.text for item in s.items)]
    assert requests, f"no request of {cid} reached the model"
    for seen in requests:
        assert "vnd.convoq" not in json.dumps(seen.body), "framework data reached a model"
    check_rider(cell, ran, requests, written)


def check_blocked(cell: Cell, ran: Ran, requests: list[Seen]) -> None:
    """A guardrail cell: blocked, saying which guardrail and why; nothing stored; an
    input trip before any model call, an output trip after the one answer."""
    assert ran.status == "blocked", ran
    assert ran.error is not None and ran.error["type"] == "GuardrailTripped", ran
    details = ran.error["details"]
    kind = cell.rider.removesuffix("_guardrail")
    assert (details["guardrail"], details["kind"]) == (GUARDED[cell.rider], kind), details
    assert details["reason"] == f"blocked {kind} of {cell.cid}"
    assert len(requests) == (0 if kind == "input" else 1), [s.items for s in requests]
    assert cell.memory.load(cell.cid) == []


def check_rider(cell: Cell, ran: Ran, requests: list[Seen], written: Any) -> None:
    rider, cid = cell.rider, cell.cid
    stored = cell.memory.load(cid)
    if rider == "metadata":
        assert ran.text == f"metadata done: cus-{cid}"
        assert any(m.role == "tool" and m.text == f"cus-{cid}" for m in stored)
    elif rider == "model_settings":
        for seen in requests:
            assert {k: seen.body.get(k) for k in SETTINGS} == SETTINGS, seen.body
    elif rider == "typed_output":
        assert len(requests) == 2, [s.items for s in requests]
        assert requests[-1].items[-1].role != "assistant", requests[-1].items[-1]
        if requests[-1].wire == "anthropic":
            assert requests[-1].body["messages"][-1]["role"] == "user"
        assert Answer.model_validate(ran.output) == Answer(**matrix_agents.ANSWER)
    elif rider == "approval":
        assert ran.text == "approval done: refunded 5"
        assert [m.text for m in stored if m.role == "tool"] == ["refunded 5"]
    elif rider == "mcp":
        assert ran.text == "mcp done: 5"
    elif rider == "subagent":
        assert ran.text == "subagent done: plain ok"
        assert [m.text for m in stored if m.role == "tool"] == ["plain ok"]
    elif rider == "handoff":
        desk = cell.agent.replace("convoq_", "desk_")
        assert ran.text == f'handoff done: {{"assistant": "{desk}"}}'
        said = [(m.role.value, m.name) for m in stored if m.role != "user"]
        assert said == [("assistant", cell.agent), ("tool", f"transfer_to_{desk}"),
                        ("assistant", desk)]  # fmt: skip
        assert "You are the desk." in json.dumps(requests[-1].body)  # the desk's own
    elif rider == "retry":
        assert ran.text == "retry done: None"
        # Asked for the tool call, refused after it, asked again after the retry: the
        # journal held the first answer and the tool's result.
        assert len(requests) == 3, [s.items for s in requests]
        assert [m.text for m in stored if m.role == "tool"] == ["None"]
    elif rider == "summary":
        sent = [item.text for item in requests[0].items] + requests[0].system
        assert any(SUMMARY_PREFIX + "users said hello" in t for t in sent), sent
        assert not any(f"folded away {n}" in t for t in sent for n in (0, 1)), sent
    elif rider in ("langchain_history", "openai_agents_history"):
        assert any("seeded hello" in item.text for item in requests[0].items)
        assert cell.read_back(len(written)) == written
    # A Pydantic AI answer given through its output tool ends with that tool's return.
    final_role = "tool" if (cell.profile, rider) == ("pydantic_ai", "typed_output") else "assistant"
    assert stored[-1].role == final_role, stored[-1]


@dataclass
class Cell:
    entry: str
    profile: str
    agent: str
    rider: str
    cid: str
    text: str
    request: pytest.FixtureRequest
    memory: RedisConversationMemory
    handle: Any = None
    response: Any = None

    @classmethod
    def new(
        cls,
        entry: str,
        profile: str,
        wire_name: str,
        rider: str,
        request: pytest.FixtureRequest,
        memory: RedisConversationMemory,
    ) -> Cell:
        agent = f"{profile}_{wire_name}"
        cid = f"m-{entry}-{agent}-{rider}-{uuid.uuid4().hex[:6]}"
        text = f"{matrix_agents.MARK}{rider} {cid}"
        return cls(entry, profile, agent, rider, cid, text, request, memory)

    def fixture(self, name: str) -> Any:
        return self.request.getfixturevalue(name)

    # -- what the conversation holds before the turn ----------------------------------------
    def seed(self) -> Any:
        if self.rider == "retry":
            matrix_agents.BROKEN.add(self.cid)
        if self.rider == "summary":
            for n in range(3):
                self.memory.append(self.cid, [Message.user(f"folded away {n}"),
                                              Message.assistant(f"noted {n}")])  # fmt: skip
            policy = CompactionPolicy(
                ScriptedModel(lambda _: "users said hello"), max_turns=1, keep_last_turns=1
            )
            assert _run(compact(self.memory, self.cid, policy)) is not None
        if self.rider == "langchain_history":
            from langchain_core.messages import AIMessage, HumanMessage

            from convoq.integrations.langchain import ConvoqChatMessageHistory

            written = [HumanMessage("seeded hello", id="h-1"), AIMessage("hi there", id="a-1")]
            ConvoqChatMessageHistory(self.cid, self.memory).add_messages(written)
            return written
        if self.rider == "openai_agents_history":
            from convoq.integrations.openai_agents import ConvoqSession

            written = [
                {"type": "message", "role": "user", "content": "seeded hello"},
                {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "hi there", "annotations": []}]},
            ]  # fmt: skip
            _run(ConvoqSession(self.cid, self.memory).add_items(written))
            return written
        return None

    def read_back(self, n: int) -> Any:
        if self.rider == "langchain_history":
            from convoq.integrations.langchain import ConvoqChatMessageHistory

            return ConvoqChatMessageHistory(self.cid, self.memory).messages[:n]
        from convoq.integrations.openai_agents import ConvoqSession

        return _run(ConvoqSession(self.cid, self.memory).get_items())[:n]

    # -- the turn, by entry point ---------------------------------------------------------
    def options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.rider == "metadata":
            options["metadata"] = {"customer": f"cus-{self.cid}"}
        if self.rider == "model_settings":
            options["model_settings"] = dict(SETTINGS)
        return options

    def run(self) -> Ran:
        return getattr(self, f"_run_{self.entry}")()

    def _run_in_process(self) -> Ran:
        agent: Agent = getattr(self.fixture("agents"), self.agent)
        with_memory = _with_memory(agent, self.memory)
        output = {"output_type": Answer} if self.rider == "typed_output" else {}
        try:
            self.response = with_memory.generate(
                self.text, conversation_id=self.cid, **self.options(), **output
            )
        except GuardrailTripped as tripped:
            return Ran("blocked", error=tripped.to_data())
        return _ran_in_process(self.response)

    def _run_worker(self) -> Ran:
        client: Client = self.fixture("client")
        output = {"output_type": Answer} if self.rider == "typed_output" else {}
        self.handle = client.submit(
            self.cid, self.text, agent=self.agent, **self.options(), **output
        )
        self.response = self.handle.wait(90, until="settled", raise_on_error=False)
        return _ran_worker(self.response)

    def _run_gateway(self) -> Ran:
        gateway: GatewayProcess = self.fixture("gateway")
        body: dict[str, Any] = {"message": self.text, "agent": self.agent, **self.options()}
        if self.rider == "typed_output":
            body["output_schema"] = {
                "type": "object",
                "properties": {"answer": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["answer", "n"],
            }
        with gateway.client() as http:
            accepted = http.post(turns_path(self.cid), json=body)
            assert accepted.status_code == 202, accepted.text
            self.handle = accepted.json()["turn_id"]
            return _ran_gateway(_wait_http(http, self.cid, self.handle))

    # -- the approval, decided elsewhere ---------------------------------------------------
    def approve(self) -> Ran:
        if self.entry == "in_process":
            fresh: Agent = getattr(importlib.reload(matrix_agents), self.agent)
            continuation = self.response.continuation.model_dump_json()
            call = self.response.pending_approvals[0].id
            return _ran_in_process(
                _with_memory(fresh, self.memory).resume(continuation, {call: True})
            )
        if self.entry == "worker":
            client: Client = self.fixture("client")
            client.approve(self.handle, self.response.pending_approvals[0].id)
            return _ran_worker(self.handle.wait(90, raise_on_error=False))
        gateway: GatewayProcess = self.fixture("gateway")
        with gateway.client() as http:
            view = _wait_http(http, self.cid, self.handle)
            call = view["pending_approvals"][0]["id"]
            url = f"{turns_path(self.cid)}/{self.handle}/approvals/{call}"
            decided = http.post(url, json={"decision": "approve"})
            assert decided.status_code == 200, decided.text
            return _ran_gateway(_wait_http(http, self.cid, self.handle, until="final"))

    # -- the failed turn, retried once the model API takes it again -------------------------
    def retry(self) -> Ran:
        matrix_agents.BROKEN.discard(self.cid)
        if self.entry == "worker":
            client: Client = self.fixture("client")
            client.retry(self.handle)
            return _ran_worker(self.handle.wait(90, raise_on_error=False))
        gateway: GatewayProcess = self.fixture("gateway")
        with gateway.client() as http:
            retried = http.post(f"{turns_path(self.cid)}/{self.handle}/retry")
            assert retried.status_code == 202, retried.text
            return _ran_gateway(_wait_http(http, self.cid, self.handle, until="final"))


def _with_memory(agent: Agent, memory: RedisConversationMemory) -> Agent:
    agent.memory = memory
    return agent


def _run(coroutine: Any) -> Any:
    from convoq._sync import run_sync

    return run_sync(coroutine)


def _wait_http(http: httpx.Client, cid: str, tid: str, until: str = "settled") -> dict[str, Any]:
    response = http.get(f"{turns_path(cid)}/{tid}", params={"wait": 60, "until": until})
    assert response.status_code == 200, response.text
    view: dict[str, Any] = response.json()
    return view


def _ran_in_process(response: Any) -> Ran:
    return Ran(
        response.status,
        response.text,
        response.output,
        [c.name for c in response.pending_approvals],
    )


def _ran_worker(result: Any) -> Ran:
    pending = [c.name for c in result.pending_approvals]
    error = result.error.to_data() if result.error is not None else None
    return Ran(result.status, result.text, result.output, pending, error)


def _ran_gateway(view: dict[str, Any]) -> Ran:
    pending = [c["name"] for c in view["pending_approvals"]]
    return Ran(view["status"], view["text"], view["output"], pending, view["error"])

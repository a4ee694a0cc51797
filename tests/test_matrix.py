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
- ``deferred``: the model calls ``ship``, whose result comes later from outside (convoq's
  ``CallDeferred``, or Pydantic AI's): the turn parks as ``waiting``; the result is
  supplied from elsewhere (``complete_call``, the gateway's ``POST .../calls/{call_id}
  /result``; in process, a fresh ``Agent`` resumes the continuation with it), after the
  worker that parked the turn was killed. The model's next request carries it as the
  call's result, and the answer quotes it; the model is not asked for the call again.
- ``scheduled``: submitted with ``delay_s`` (worker, gateway), the turn is ``scheduled``,
  then runs once due: by Redis's clock it was queued and started no earlier than its due
  time.
- ``merge``: while a first turn of the conversation is held in its model call, two
  messages are sent with ``if_busy="merge"``: one turn answers both, its user message
  holds them in order, and that is what the model received.

Cells that cannot apply are in :data:`NOT_APPLICABLE` with the reason.
"""

from __future__ import annotations

import importlib
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from convoq import Agent, Client, GuardrailTripped
from convoq.compaction import CompactionPolicy, compact
from convoq.errors import ConvoqError
from convoq.memory import RedisConversationMemory
from convoq.messages import Message, TextPart
from convoq.models import ScriptedModel
from convoq.summary import SUMMARY_PREFIX
from tests.support import matrix_agents
from tests.support.gateway import GatewayProcess, running_gateway, turns_path
from tests.support.redis_server import RedisServer
from tests.support.wire_server import Seen, WireServer
from tests.support.workers import WorkerPool, running_pool, wait_until

pytestmark = pytest.mark.slow

ENTRIES = ("in_process", "worker", "gateway")
PROFILES = ("convoq", "pydantic_ai")
WIRES = matrix_agents.WIRES
RIDERS = ("metadata", "model_settings", "typed_output", "approval", "mcp", "summary",
          "langchain_history", "openai_agents_history", "input_guardrail",
          "output_guardrail", "retry", "subagent", "handoff", "deferred", "scheduled",
          "merge")  # fmt: skip
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
    ("in_process", ANY, ANY, "scheduled"): "an in-process Agent runs its turn when it is"
    " called: generate() has no submit to give a due time to; a tool's ctx.schedule there"
    " stores a scheduled turn that the workers of its Redis run"
    " (tests/test_scheduling_in_process.py)",
    ("in_process", ANY, ANY, "merge"): "an in-process Agent keeps no queue to merge into:"
    " Agent(if_busy='merge') is refused naming the option"
    " (test_an_in_process_agent_refuses_to_merge, below)",
}
SETTINGS = {"temperature": 0.25, "top_p": 0.5}
DELAY_S = 1.0  # the scheduled rider's delay: the turn is due a second after its submit
# Riders whose worker and gateway turns are all started ahead, by a module fixture: the
# parked ones (their first worker is killed before they resume), the scheduled ones (their
# delays run at once, not one after another).
AHEAD = {"approval": "parked", "deferred": "parked", "scheduled": "scheduled"}


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
    merged: list[str] = field(default_factory=list)
    times: dict[str, int | None] = field(default_factory=dict)  # the record's, in Redis ms


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


def _ahead(
    riders: tuple[str, ...], request: pytest.FixtureRequest, memory: RedisConversationMemory
) -> dict[tuple[str, str, str, str], tuple[Cell, Ran]]:
    """Every worker and gateway cell of ``riders``, started now: each cell's turn and what
    it came to once it rests (parked, scheduled)."""
    cells = {
        (entry, profile, wire_name, rider): Cell.new(
            entry, profile, wire_name, rider, request, memory
        )
        for entry in ("worker", "gateway") for profile in PROFILES for wire_name in WIRES
        for rider in riders
    }  # fmt: skip
    for cell in cells.values():  # all submitted first: the workers run them side by side
        cell.submit()
    return {key: (cell, cell.settle()) for key, cell in cells.items()}


@pytest.fixture(scope="module")
def parked(
    request: pytest.FixtureRequest, pool: WorkerPool, memory: RedisConversationMemory
) -> dict[tuple[str, str, str, str], tuple[Cell, Ran]]:
    """Every worker and gateway approval and deferred cell's turn, parked on the module's
    first worker; that worker is then killed, so each of them resumes on another one."""
    turns = _ahead(("approval", "deferred"), request, memory)
    first = list(pool.workers)
    pool.start(1)
    for worker in first:
        worker.kill()  # parked turns hold no worker: nothing of theirs dies with it
    assert not any(w.alive() for w in first)
    return turns


@pytest.fixture(scope="module")
def scheduled(
    request: pytest.FixtureRequest, memory: RedisConversationMemory
) -> dict[tuple[str, str, str, str], tuple[Cell, Ran]]:
    """Every worker and gateway scheduled cell's turn, submitted at once (each due
    DELAY_S later). The riders before it in RIDERS ran first, so the worker the parked
    cells kill is gone by now: no scheduled turn runs on it."""
    return _ahead(("scheduled",), request, memory)


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
    if rider in AHEAD and entry != "in_process":
        ahead: dict[tuple[str, str, str, str], tuple[Cell, Ran]]
        ahead = request.getfixturevalue(AHEAD[rider])
        cell, ran = ahead[(entry, profile, wire_name, rider)]
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
    if rider == "deferred":
        assert ran.status == "waiting" and ran.pending == ["ship"], ran
        ran = cell.complete()
    if rider == "scheduled":
        assert ran.status == "scheduled", ran
        ran = cell.final()
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
    stored = cell.memory.load(cell.cid)
    later = LATER_CHECKS.get(cell.rider)
    if later is not None:
        later(cell, ran, requests, stored)
    else:
        check_first_riders(cell, ran, requests, written, stored)
    # A Pydantic AI answer given through its output tool ends with that tool's return.
    typed = (cell.profile, cell.rider) == ("pydantic_ai", "typed_output")
    assert stored[-1].role == ("tool" if typed else "assistant"), stored[-1]


def check_first_riders(
    cell: Cell, ran: Ran, requests: list[Seen], written: Any, stored: list[Message]
) -> None:
    rider, cid = cell.rider, cell.cid
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


def check_deferred(cell: Cell, ran: Ran, requests: list[Seen], stored: list[Message]) -> None:
    """The supplied result is the call's result the model read (asked once for the call,
    once after it: the call is not asked or run again), and the answer quotes it."""
    supplied = json.dumps(cell.supplied, separators=(",", ":"))
    assert ran.text == f"deferred done: {supplied}", ran
    assert [m.text for m in stored if m.role == "tool"] == [supplied]
    assert len(requests) == 2, [s.items for s in requests]
    results = [(i.call_id, i.text) for i in requests[-1].items if i.role == "tool"]
    assert results == [("call_deferred", supplied)], requests[-1].items


def check_scheduled(cell: Cell, ran: Ran, requests: list[Seen], stored: list[Message]) -> None:
    """Scheduled at its submit, due DELAY_S later; queued and started no earlier (Redis's
    clock, the record's times)."""
    assert ran.text == "scheduled ok" and len(requests) == 1, ran
    created, due = ran.times["created_ms"], ran.times["due_ms"]
    fired, started = ran.times["fired_ms"], ran.times["started_ms"]
    assert None not in (created, due, fired, started), ran.times
    assert due >= created + DELAY_S * 1000, ran.times  # type: ignore[operator]
    assert started >= fired >= due, ran.times  # type: ignore[operator]
    assert cell.statuses()[:3] == ["scheduled", "queued", "running"]


def check_merge(cell: Cell, ran: Ran, requests: list[Seen], stored: list[Message]) -> None:
    """One turn answered both messages: its user message holds them in order, and that
    is what the model received after the held turn's."""
    hold, first, second = (f"{cell.text} {word}" for word in ("hold", "first", "second"))
    assert ran.text == "merge ok" and len(requests) == 2, (ran, [s.items for s in requests])
    users = [item.text for item in requests[-1].items if item.role == "user"]
    assert users[:-1] == [hold] and first in users[-1] and second in users[-1], users
    assert users[-1].index(first) < users[-1].index(second), users[-1]
    said = [
        [p.text for p in m.content if isinstance(p, TextPart)] for m in stored if m.role == "user"
    ]
    assert said == [[hold], [first, second]], said


LATER_CHECKS: dict[str, Callable[[Cell, Ran, list[Seen], list[Message]], None]] = {
    "deferred": check_deferred,
    "scheduled": check_scheduled,
    "merge": check_merge,
}


def test_an_in_process_agent_refuses_to_merge() -> None:
    """The merge rider in process: an Agent keeps no queue to merge into, so it refuses
    if_busy='merge' naming the option (a Client's submit takes it)."""
    with pytest.raises(ConvoqError, match=r"Agent\(if_busy='merge'\) is not supported"):
        Agent(ScriptedModel(lambda _: "hi"), if_busy="merge")  # type: ignore[arg-type]


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
        if self.rider == "scheduled":
            options["delay_s"] = DELAY_S
        return options

    @property
    def supplied(self) -> dict[str, str]:
        """The deferred rider's result, supplied from outside."""
        return {"tracking": f"T-{self.cid[-6:]}"}

    def run(self) -> Ran:
        if self.entry == "in_process":
            return self._run_in_process()
        if self.rider == "merge":
            return self._merge_worker() if self.entry == "worker" else self._merge_gateway()
        self.submit()
        return self.settle()

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

    def submit(self) -> None:
        """Submit the turn (worker, gateway): ``handle`` is its handle, or its turn id."""
        output = {"output_type": Answer} if self.rider == "typed_output" else {}
        if self.entry == "worker":
            client: Client = self.fixture("client")
            self.handle = client.submit(
                self.cid, self.text, agent=self.agent, **self.options(), **output
            )
            return
        body: dict[str, Any] = {"message": self.text, "agent": self.agent, **self.options()}
        if output:
            body["output_schema"] = {
                "type": "object",
                "properties": {"answer": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["answer", "n"],
            }
        gateway: GatewayProcess = self.fixture("gateway")
        with gateway.client() as http:
            accepted = http.post(turns_path(self.cid), json=body)
        assert accepted.status_code == 202, accepted.text
        self.response = accepted.json()
        self.handle = self.response["turn_id"]

    def settle(self) -> Ran:
        """What the submitted turn came to once it rests: final, parked, or scheduled."""
        return getattr(self, f"_settle_{self.entry}")()

    def _settle_worker(self) -> Ran:
        if self.rider == "scheduled":  # what its submit made of it (no wait: it may be due)
            return Ran(self.statuses(first=True)[0])
        if self.rider == "deferred":  # a wait() goes on through "waiting": poll
            wait_until(lambda: self.handle.status() not in ("queued", "running"), 90)
            return _ran_waiting(_fields(self.handle.record()))
        self.response = self.handle.wait(90, until="settled", raise_on_error=False)
        return _ran_worker(self.response)

    def _settle_gateway(self) -> Ran:
        if self.rider == "scheduled":  # what its submit made of it
            return Ran(self.response["status"])
        gateway: GatewayProcess = self.fixture("gateway")
        with gateway.client() as http:
            if self.rider == "deferred":  # a long poll goes on through "waiting": poll
                path = f"{turns_path(self.cid)}/{self.handle}"
                view = wait_until(lambda: _unless(http.get(path).json(), "queued", "running"), 90)
                return _ran_waiting(view)
            return _ran_gateway(_wait_http(http, self.cid, self.handle))

    def statuses(self, first: bool = False) -> list[str]:
        """The statuses the turn's events went through (``first``: the first alone)."""
        client: Client = self.fixture("client")
        tid = self.handle if isinstance(self.handle, str) else self.handle.turn_id
        said = []
        for event in client.handle(self.cid, tid).events(timeout=30):
            if event.type == "status":
                said.append(event.data["status"])
                if first:
                    break
        return said

    # -- two messages merged while a turn of the conversation is held -----------------------
    def _merge(
        self, submit: Callable[[str, str], tuple[str, str | None]], wait: Callable[[str], Ran]
    ) -> Ran:
        """A first turn held in its model call; two messages sent with if_busy="merge"
        meanwhile: the first is queued, the second joins it (``submit`` answers the turn
        id and ``merged_from``); one turn answers both."""
        entered, go = matrix_agents.HELD[self.cid] = (threading.Event(), threading.Event())
        try:
            held, _ = submit(f"{self.text} hold", "queue")
            assert entered.wait(matrix_agents.HOLD_S), f"{self.cid}: the first turn never ran"
            first, own = submit(f"{self.text} first", "merge")
            joined, merged_from = submit(f"{self.text} second", "merge")
        finally:
            go.set()
        before = wait(held)
        assert (before.status, before.text) == ("succeeded", "merge held"), before
        assert own is None and joined == first and merged_from is not None, (first, joined)
        ran = wait(first)
        assert ran.merged == [merged_from], ran
        return ran

    def _merge_worker(self) -> Ran:
        client: Client = self.fixture("client")
        handles: dict[str, Any] = {}

        def submit(text: str, mode: str) -> tuple[str, str | None]:
            handle = client.submit(self.cid, text, agent=self.agent, if_busy=mode)  # type: ignore[arg-type]
            handles[handle.turn_id] = handle
            return handle.turn_id, handle.merged_from

        return self._merge(
            submit, lambda tid: _ran_worker(handles[tid].wait(90, raise_on_error=False))
        )

    def _merge_gateway(self) -> Ran:
        gateway: GatewayProcess = self.fixture("gateway")

        def submit(text: str, mode: str) -> tuple[str, str | None]:
            body = {"message": text, "agent": self.agent, "if_busy": mode}
            accepted = http.post(turns_path(self.cid), json=body)
            assert accepted.status_code == 202, accepted.text
            return accepted.json()["turn_id"], accepted.json()["merged_from"]

        with gateway.client() as http:
            return self._merge(
                submit, lambda tid: _ran_gateway(_wait_http(http, self.cid, tid, until="final"))
            )

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

    # -- the deferred call's result, supplied from elsewhere --------------------------------
    def complete(self) -> Ran:
        if self.entry == "in_process":
            fresh: Agent = getattr(importlib.reload(matrix_agents), self.agent)
            continuation = self.response.continuation.model_dump_json()
            call = self.response.waiting_for[0]["call_id"]
            return _ran_in_process(
                _with_memory(fresh, self.memory).resume(continuation, {call: self.supplied})
            )
        if self.entry == "worker":
            client: Client = self.fixture("client")
            assert client.complete_call(self.handle, "call_deferred", self.supplied) == "resume"
            return _ran_worker(self.handle.wait(90, raise_on_error=False))
        gateway: GatewayProcess = self.fixture("gateway")
        with gateway.client() as http:
            url = f"{turns_path(self.cid)}/{self.handle}/calls/call_deferred/result"
            supplied = http.post(url, json={"result": self.supplied})
            assert supplied.status_code == 200, supplied.text
            assert supplied.json()["outcome"] == "resume", supplied.json()
            return _ran_gateway(_wait_http(http, self.cid, self.handle, until="final"))

    # -- the scheduled turn, once it ran -----------------------------------------------------
    def final(self) -> Ran:
        if self.entry == "worker":
            ran = _ran_worker(self.handle.wait(90, until="final", raise_on_error=False))
            ran.times = _times(_fields(self.handle.record()))
            return ran
        gateway: GatewayProcess = self.fixture("gateway")
        with gateway.client() as http:
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
    # A person's approvals pending, else the calls waiting for the world.
    pending = [c.name for c in response.pending_approvals]
    return Ran(
        response.status,
        response.text,
        response.output,
        pending or [w["name"] for w in response.waiting_for],
    )


def _ran_worker(result: Any) -> Ran:
    pending = [c.name for c in result.pending_approvals]
    error = result.error.to_data() if result.error is not None else None
    return Ran(result.status, result.text, result.output, pending, error, list(result.merged))


def _ran_gateway(view: dict[str, Any]) -> Ran:
    pending = [c["name"] for c in view["pending_approvals"]]
    return Ran(
        view["status"], view["text"], view["output"], pending, view["error"], view["merged"],
        _times(view),
    )  # fmt: skip


def _ran_waiting(record: dict[str, Any]) -> Ran:
    """A parked turn's record (a worker's) or view (the gateway's): its status and the
    calls waiting for the world."""
    if "waiting_for" in record:
        return Ran(record["status"], pending=[w["name"] for w in record["waiting_for"]])
    result = record["result"] or {}
    waits = result.get("waits") or {}
    calls = result.get("pending_approvals") or []
    return Ran(record["status"], pending=[c["name"] for c in calls if c["id"] in waits])


def _fields(record: Any) -> dict[str, Any]:
    """A worker's turn record, as the fields the gateway's view of it has."""
    names = ("status", "result", "created_ms", "due_ms", "fired_ms", "started_ms")
    return {name: getattr(record, name) for name in names}


def _times(record: dict[str, Any]) -> dict[str, int | None]:
    return {k: record.get(k) for k in ("created_ms", "due_ms", "fired_ms", "started_ms")}


def _unless(view: dict[str, Any], *statuses: str) -> dict[str, Any] | None:
    return None if view["status"] in statuses else view

"""The window precedence is written once, in Python (:class:`convoq.window.WindowRule`); the
scripts keep a copy for Redis (``turn_window()`` in ``redis/lua/_lib.lua``). Every case of
the rule (the turn's ``keep_last_turns`` unset, set or 0; its agent's set or 0; a token
budget on neither, the turn, the agent or both; a stored summary or not; a compaction
policy or not) runs through both on a real Redis, and both must agree on the window the
turn is handed out with and on what is sent: the worker (acquire, then the runner), the
in-process Agent, and the rule applied to the whole history in this process."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import pytest

from convoq import Agent
from convoq.compaction import CompactionPolicy
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import Message, MessageRole
from convoq.models import ScriptedModel
from convoq.summary import Summary, with_summary
from convoq.testing import RecordingModel
from convoq.window import WindowRule, split_turns
from convoq.worker.profiles import Profiles
from convoq.worker.runner import Runner, RunnerConfig
from tests.support.protocol_helpers import open_protocol

STORED = 6  # turns q0..q5, each 35 tokens by the default counter; the lead "be brief" 6
WATERMARK = 2  # a stored summary (17 tokens) covers q0 and q1
AGENT_BUDGET = 100  # the newest 2 turns fit, with or without the summary
TURN_BUDGET = 160  # the newest 4 fit without the summary, 3 with it
LEASE_MS = 60_000


@dataclass(frozen=True)
class Case:
    turn_keep: int | None  # the turn's own keep_last_turns (None: not given)
    agent_keep: int
    turn_budget: int | None  # the turn's own max_history_tokens
    agent_budget: int | None
    summary: bool  # the conversation has a stored summary
    compaction: bool  # the agent has a compaction policy

    @property
    def id(self) -> str:
        keep = "unset" if self.turn_keep is None else self.turn_keep
        budget = {
            (False, False): "none",
            (True, False): "turn",
            (False, True): "agent",
            (True, True): "both",
        }[(self.turn_budget is not None, self.agent_budget is not None)]
        return (
            f"turn_keep={keep}-agent_keep={self.agent_keep}-budget={budget}"
            f"-{'summary' if self.summary else 'no_summary'}"
            f"-{'compaction' if self.compaction else 'no_compaction'}"
        )

    @property
    def options(self) -> dict[str, Any]:
        """The turn's options as a client submits them (only what was given)."""
        options: dict[str, Any] = {}
        if self.turn_keep is not None:
            options["keep_last_turns"] = self.turn_keep
        if self.turn_budget is not None:
            options["max_history_tokens"] = self.turn_budget
        return options

    def agent(self, model: Any, **extra: Any) -> Agent:
        policy = CompactionPolicy(ScriptedModel(lambda request: "never asked"), max_turns=100)
        return Agent(
            model,
            name="precedence",
            keep_last_turns=self.agent_keep,
            max_history_tokens=self.agent_budget,
            compaction=policy if self.compaction else None,
            **extra,
        )


CASES = [
    Case(turn_keep, agent_keep, turn_budget, agent_budget, summary, compaction)
    for turn_keep, agent_keep, (turn_budget, agent_budget), summary, compaction in (
        itertools.product(
            (None, 3, 0),
            (4, 0),
            ((None, None), (TURN_BUDGET, None), (None, AGENT_BUDGET), (TURN_BUDGET, AGENT_BUDGET)),
            (False, True),
            (False, True),
        )
    )
]

# What the rule's docstring says, spelled out for some of the cases above: the turns sent
# ("S" is the summary) and the turns of history the lease brings (0: all).
SPELLED_OUT = [
    (Case(None, 4, None, None, False, False), "q2 q3 q4 q5", 4),  # the agent's keep
    (Case(3, 4, None, None, False, False), "q3 q4 q5", 3),  # the turn's keep beats it
    (Case(0, 4, None, None, False, False), "q0 q1 q2 q3 q4 q5", 0),  # 0 too: every turn
    (Case(None, 0, None, None, False, False), "q0 q1 q2 q3 q4 q5", 0),
    (Case(None, 4, None, AGENT_BUDGET, False, False), "q4 q5", 1),  # the store chooses
    (Case(None, 4, TURN_BUDGET, None, False, False), "q2 q3 q4 q5", 1),
    (Case(None, 0, TURN_BUDGET, AGENT_BUDGET, False, False), "q2 q3 q4 q5", 1),
    (Case(3, 0, None, AGENT_BUDGET, False, False), "q4 q5", 1),  # keep, then the budget
    (Case(None, 4, None, None, True, False), "S q2 q3 q4 q5", 1),  # a summary, any agent
    (Case(3, 0, None, None, True, False), "S q3 q4 q5", 1),
    (Case(None, 0, TURN_BUDGET, None, True, False), "S q3 q4 q5", 1),
    (Case(3, 4, None, None, True, False), "S q3 q4 q5", 1),
    (Case(None, 0, None, None, False, True), "q0 q1 q2 q3 q4 q5", 1),  # compaction
    (Case(0, 4, None, None, False, True), "q0 q1 q2 q3 q4 q5", 1),
    (Case(None, 4, None, None, True, True), "S q2 q3 q4 q5", 1),
]


def history() -> list[Message]:
    turns = [
        m
        for i in range(STORED)
        for m in (Message.user(f"q{i} " + "word " * 20), Message.assistant(f"a{i}"))
    ]
    return [Message.system("be brief"), *turns]


def labels(messages: list[Message]) -> str:
    """The turns of ``messages`` by their user message ("S": the summary)."""
    said = []
    for m in messages:
        if m.role == MessageRole.USER:
            said.append(m.text.split()[0])
        elif m.role == MessageRole.SYSTEM and m.text != "be brief":
            said.append("S")
    return " ".join(said)


async def stored(memory: RedisConversationMemory, cid: str, case: Case) -> Summary | None:
    await memory.aappend(cid, history())
    if not case.summary:
        return None
    _, _, basis = await memory.asummary_state(cid)
    summary = Summary.of("earlier turns", watermark=WATERMARK, version=1)
    await memory.acommit_summary(cid, summary, basis)
    return summary


async def run_case(case: Case, redis_url: str, prefix: str) -> tuple[str, int]:
    """Both sides of ``case``; they must agree. Returns what is sent and the turns of
    history the lease brings (0: all)."""
    worker_model, agent_model = RecordingModel(), RecordingModel()
    profile = case.agent(worker_model)
    rule = WindowRule.of(profile)
    chosen = rule.for_turn(case.options, summarised=case.summary)
    # The in-process Agent asks the same rule with the same arguments.
    assert rule.window(case.turn_keep, case.turn_budget) == chosen.window
    memory = RedisConversationMemory(redis_url, prefix=prefix)
    try:
        summary = await stored(memory, "worker", case)
        await stored(memory, "agent", case)
        # The rule, applied in this process to the whole history.
        lead, turns = split_turns(history())
        expected = labels(chosen.window.apply(with_summary(lead, turns, summary)))
        async with open_protocol(redis_url, prefix) as proto:
            # The scripts: the window the turn is handed out with.
            profiles = Profiles([profile])
            message = Message.user("now")
            await proto.submit("worker", "t1", agent="precedence", message=message,
                               options=case.options)  # fmt: skip
            acquired = await proto.acquire(
                "worker", worker_id="w", lease_ms=LEASE_MS, window=profiles.windows()
            )
            assert acquired is not None and acquired.summarised is case.summary
            handed = len(split_turns(acquired.history)[1])
            assert handed == (min(chosen.handed_turns, STORED) or STORED)
            assert await proto.release("worker", "t1", fence=acquired.fence)
            # The worker: what its runner sends, from the lease or chosen by the store.
            runner = Runner(proto, profiles, RunnerConfig(worker_id="w", lease_ms=LEASE_MS))
            assert (await runner.drain("worker")).succeeded == ["t1"]
        agent = case.agent(agent_model, memory=memory, conversation_id="agent")
        await agent.agenerate("now", keep_last_turns=case.turn_keep,
                              max_history_tokens=case.turn_budget)  # fmt: skip
    finally:
        await memory.aclose()
    assert labels(worker_model.sent[-1]) == expected + " now"
    assert labels(agent_model.sent[-1]) == expected + " now"
    return expected, chosen.handed_turns


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
async def test_the_scripts_and_the_rule_choose_the_same_window(
    case: Case, redis_url: str, key_prefix: str
) -> None:
    await run_case(case, redis_url, key_prefix)


@pytest.mark.parametrize(
    ("case", "sent", "handed"), SPELLED_OUT, ids=[case.id for case, _, _ in SPELLED_OUT]
)
async def test_the_rule_sends_what_its_docstring_says(
    case: Case, sent: str, handed: int, redis_url: str, key_prefix: str
) -> None:
    assert await run_case(case, redis_url, key_prefix) == (sent, handed)

"""Rolling summaries: a policy summarises the oldest turns with a model, the summary and
its watermark are committed in one fenced write, and what is sent is lead + summary +
the turns after it (attachments of summarised turns are not re-sent); on every backend,
in process and through the workers."""

from __future__ import annotations

from typing import Any

import pytest

from convoq import Agent, Message
from convoq.compaction import CompactionPolicy, compact, compact_idle
from convoq.errors import ConfigurationError, SummaryConflictError
from convoq.messages import ImagePart, MessageRole, TextPart
from convoq.models import ModelRequest, ScriptedModel
from convoq.summary import SUMMARY_PREFIX
from convoq.testing import RecordingModel
from convoq.window import Window

PHOTO = b"\x89PNG holiday photo"


def summariser() -> ScriptedModel:
    def fn(request: ModelRequest) -> str:
        users = [
            line for line in request.messages[-1].text.splitlines() if line.startswith("user:")
        ]
        return "covers " + ", ".join(line.split()[1] for line in users)

    return ScriptedModel(fn, name="summariser")


def texts(messages: list[Message]) -> list[str]:
    return [m.text for m in messages]


def test_agent_compacts_and_sends_lead_summary_and_later_turns(memory: Any) -> None:
    policy = CompactionPolicy(summariser(), max_turns=3, keep_last_turns=1)
    model = RecordingModel()
    agent = Agent(model, memory=memory, conversation_id="long talk", compaction=policy)
    memory.append("long talk", [Message.system("rules")])
    photo = Message(
        role=MessageRole.USER,
        content=[TextPart(text="t0"), ImagePart(data=PHOTO, mime_type="image/png")],
    )
    agent.generate(photo)
    for i in range(1, 4):
        agent.generate(f"t{i}")
    # 4 turns > 3: t0..t2 were folded in, t3 is kept as it is.
    agent.generate("t4")
    sent = model.sent[-1]
    assert texts(sent) == ["rules", SUMMARY_PREFIX + "covers t0, t1, t2", "t3", "seen 8", "t4"]
    assert all(not m.attachments for m in sent)  # the photo's turn is summarised
    stored = memory.load("long talk")
    assert len(stored) == 11 and stored[1].attachments[0].data == PHOTO  # all kept
    summary = memory_summary(memory, "long talk")
    assert summary.watermark == 3 and summary.version == 1


def memory_summary(memory: Any, cid: str) -> Any:
    from convoq._sync import run_sync

    return run_sync(memory.asummary(cid))


async def test_the_summary_commit_is_refused_when_history_or_summary_changed(memory: Any) -> None:
    policy = CompactionPolicy(summariser(), max_turns=1, keep_last_turns=0)
    for i in range(3):
        await memory.aappend("c", [Message.user(f"u{i}"), Message.assistant(f"a{i}")])
    messages, previous, basis = await memory.asummary_state("c")
    assert previous is None and len(messages) == 6
    first = await compact(memory, "c", policy)
    assert first is not None and first.watermark == 3
    from convoq.summary import Summary

    stale = Summary.of("stale", watermark=2, version=1)
    with pytest.raises(SummaryConflictError):  # the previous summary changed
        await memory.acommit_summary("c", stale, basis)
    _, current, basis = await memory.asummary_state("c")
    await memory.aappend("c", [Message.user("u3"), Message.assistant("a3")])
    with pytest.raises(SummaryConflictError):  # a turn was appended
        await memory.acommit_summary("c", Summary.of("x", watermark=4, version=2), basis)
    assert await memory.asummary("c") == current


async def test_prune_keeps_the_summary_and_moves_its_watermark(memory: Any) -> None:
    policy = CompactionPolicy(summariser(), max_turns=2, keep_last_turns=1)
    for i in range(4):
        await memory.aappend("p", [Message.user(f"u{i}"), Message.assistant(f"a{i}")])
    await compact(memory, "p", policy)
    sent = await memory.aload_window("p", Window(with_summary=True))
    assert texts(sent) == [SUMMARY_PREFIX + "covers u0, u1, u2", "u3", "a3"]
    assert await memory.aprune("p", keep_last_turns=2) == 2
    assert (await memory.asummary("p")).watermark == 1
    assert await memory.aload_window("p", Window(with_summary=True)) == sent
    # A budget counts the summary too; the kept turns still follow it.
    small = await memory.aload_window("p", Window(max_tokens=20, with_summary=True))
    assert texts(small) == [SUMMARY_PREFIX + "covers u0, u1, u2"]


async def test_compaction_waits_for_no_turn_and_skips_a_busy_conversation(memory: Any) -> None:
    policy = CompactionPolicy(summariser(), max_turns=1, keep_last_turns=0)
    for i in range(2):
        await memory.aappend("b", [Message.user(f"u{i}"), Message.assistant(f"a{i}")])
    await memory.areserve("b", "a-running-turn")
    assert await compact_idle(memory, "b", policy) is None
    assert await memory.asummary("b") is None
    await memory.arelease("b", "a-running-turn")
    assert (await compact_idle(memory, "b", policy)).watermark == 2


def test_a_policy_needs_a_threshold() -> None:
    with pytest.raises(ConfigurationError):
        CompactionPolicy(summariser())
    with pytest.raises(ConfigurationError):
        CompactionPolicy(summariser(), max_turns=-1)


async def test_the_runner_queues_compaction_after_a_stored_turn_and_sends_the_summary(
    redis_url: str, key_prefix: str
) -> None:
    from convoq.memory.redis import RedisConversationMemory
    from convoq.redis import TurnProtocol
    from convoq.worker.profiles import Profiles
    from convoq.worker.runner import Runner, RunnerConfig

    proto = TurnProtocol.from_url(redis_url, prefix=key_prefix)
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    policy = CompactionPolicy(summariser(), max_turns=2, keep_last_turns=1)
    model = RecordingModel()
    profiles = Profiles([Agent(model, name="c", compaction=policy), Agent(model, name="plain")])
    queued: list[tuple[str, str]] = []

    async def on_compact(cid: str, agent: str) -> None:
        queued.append((cid, agent))
        await compact_idle(memory, cid, policy)  # what the compact task does

    runner = Runner(
        proto, profiles, RunnerConfig(worker_id="w", lease_ms=5_000), on_compact=on_compact
    )
    try:
        for i in range(3):
            await proto.submit("r", f"t{i}", agent="c", message=Message.user(f"u{i}"), options={})
            await runner.drain("r")
        await proto.submit("r", "p1", agent="plain", message=Message.user("p"), options={})
        await runner.drain("r")
        assert queued == [("r", "c")] * 3  # the plain profile queues none
        assert (await memory.asummary("r")).watermark == 2
        await proto.submit("r", "t3", agent="c", message=Message.user("u3"), options={})
        await runner.drain("r")
        assert texts(model.sent[-1])[:2] == [SUMMARY_PREFIX + "covers u0, u1", "u2"]
    finally:
        await proto.close()
        await memory.aclose()


async def test_a_token_threshold_compacts_once_the_unsummarised_turns_pass_it(
    memory: Any,
) -> None:
    policy = CompactionPolicy(summariser(), max_tokens=100, keep_last_turns=1)
    await memory.aappend("t", [Message.user("u0 " + "w " * 20), Message.assistant("a0")])
    await memory.aappend("t", [Message.user("u1 " + "w " * 20), Message.assistant("a1")])
    assert await compact(memory, "t", policy) is None  # about 40 tokens: not due
    for i in range(2, 6):
        await memory.aappend("t", [Message.user(f"u{i} " + "w " * 20), Message.assistant("a")])
    summary = await compact(memory, "t", policy)
    assert summary is not None and summary.watermark == 5
    assert summary.text == SUMMARY_PREFIX + "covers u0, u1, u2, u3, u4"

"""Token budgets for what is sent: lead messages plus the newest whole turns that fit,
counted from the usage recorded with each turn or an offline estimate, on every backend,
through the Agent, the runner and submit; on Redis chosen from per-turn counts without
reading the whole history."""

from __future__ import annotations

import pytest
import redis

from convoq import Agent, Message, RecordedTokenCounter, TokenizerCounter, ToolCall
from convoq.client._base import build_submission
from convoq.errors import ConvoqError, CorruptDataError
from convoq.limits import Limits
from convoq.memory import ConversationMemory
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import ImagePart, MessageRole, TextPart
from convoq.redis import TurnProtocol
from convoq.redis.keys import KeySchema
from convoq.testing import RecordingModel
from convoq.tokens import IMAGE_TOKENS, estimate_tokens
from convoq.usage import Usage
from convoq.window import STORE_CHOOSES, Window, split_turns
from convoq.worker.profiles import Profiles
from convoq.worker.runner import Runner, RunnerConfig


def tool_turn(i: int, words: int = 10) -> list[Message]:
    call = ToolCall(id=f"c{i}", name="lookup", arguments={"q": i})
    return [
        Message.user(f"q{i} " + "word " * words),
        Message.assistant("", tool_calls=[call]),
        Message.tool_result(call, f"result {i}"),
        Message.assistant(f"a{i}"),
    ]


def history(n: int) -> list[Message]:
    out = [Message.system("rules")]
    for i in range(n):
        out += tool_turn(i, words=i * 3)
    return out


def user_texts(messages: list[Message]) -> list[str]:
    return [m.text.split(" ")[0] for m in messages if m.role == MessageRole.USER]


# ---- the window itself -----------------------------------------------------------------


def test_whole_turns_only_newest_first_and_the_lead_always() -> None:
    messages = history(6)
    counter = RecordedTokenCounter()
    lead, turns = split_turns(messages)
    costs = [counter.count(t) for t in turns]
    budget = counter.count(lead) + costs[-1] + costs[-2] + 1
    kept = Window(max_tokens=budget).apply(messages)
    assert kept == lead + turns[-2] + turns[-1]  # tool calls travel with their results
    assert Window(max_tokens=0).apply(messages) == lead
    # The newest turn does not fit: no older one is sent in its place.
    assert Window(max_tokens=counter.count(lead) + costs[-1] - 1).apply(messages) == lead
    # With keep_last_turns too: the smaller of both.
    assert Window(keep_last_turns=1, max_tokens=10**6).apply(messages) == lead + turns[-1]
    assert Window(max_tokens=budget).apply(kept) == kept  # applying twice is harmless


def test_recorded_usage_counts_where_present_and_the_estimate_otherwise() -> None:
    user = Message.user("hello there")
    plain = [user, Message.assistant("x" * 400)]
    metered = [
        user,
        Message.assistant(
            "x" * 400, usage=Usage(prompt_tokens=50, completion_tokens=7, total_tokens=57)
        ),
    ]
    counter = RecordedTokenCounter()
    assert counter.count(plain) == estimate_tokens(plain)
    assert counter.count(metered) == estimate_tokens([user]) + 7
    image = Message(
        role=MessageRole.USER,
        content=[TextPart(text="see"), ImagePart(data=b"\x89PNG", mime_type="image/png")],
    )
    assert estimate_tokens([image]) >= IMAGE_TOKENS
    exact = TokenizerCounter(lambda text: len(text.split()))
    assert exact.count([Message.user("one two three")]) == 4 + 3


def test_bad_budgets_are_refused_before_any_io() -> None:
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(ConvoqError, match="max_history_tokens must be"):
            Agent(RecordingModel(), max_history_tokens=bad)  # type: ignore[arg-type]
        with pytest.raises(ConvoqError, match="max_history_tokens must be"):
            build_submission(
                "c", "hi", agent="a", known_agents=None, limits=Limits(), max_history_tokens=bad
            )  # type: ignore[arg-type]
    sub = build_submission(
        "c", "hi", agent="a", known_agents=None, limits=Limits(), max_history_tokens=50
    )
    assert sub.options == {"max_history_tokens": 50}


# ---- every backend ---------------------------------------------------------------------


@pytest.mark.parametrize("keep", [None, 2])
async def test_every_backend_loads_the_same_budget_window(
    memory: ConversationMemory, keep: int | None
) -> None:
    messages = history(12)
    memory.append("b", messages[:1])
    for turn in split_turns(messages)[1]:
        await memory.aappend("b", turn)
    assert memory.load("b") == messages
    counter = RecordedTokenCounter()
    for budget in (0, 5, 40, 80, 150, 300, 10**6):
        expected = Window(keep, budget).apply(messages)
        assert await memory.aload("b", last_turns=keep, max_tokens=budget) == expected, budget
        assert memory.load("b", last_turns=keep, max_tokens=budget) == expected, budget
    tiny = TokenizerCounter(lambda text: 1)
    assert memory.load("b", max_tokens=30, counter=tiny) == Window(None, 30, tiny).apply(messages)
    del counter


def test_agent_sends_only_what_fits_per_agent_and_per_call(memory: ConversationMemory) -> None:
    model = RecordingModel()
    agent = Agent(model, memory=memory, conversation_id="a b", max_history_tokens=10**6)
    for i in range(5):
        agent.generate(f"t{i} " + "word " * 40)
    assert user_texts(model.sent[-1]) == ["t0", "t1", "t2", "t3", "t4"]
    one_turn = RecordedTokenCounter().count(
        [Message.user("t4 " + "word " * 40), Message.assistant("seen 9")]
    )
    agent.generate("now", max_history_tokens=one_turn + 2)
    assert user_texts(model.sent[-1]) == ["t4", "now"]
    agent.generate("then", max_history_tokens=0)
    assert user_texts(model.sent[-1]) == ["then"]
    assert len(memory.load("a b")) == 14  # storage keeps every turn


def test_a_pluggable_counter_decides(memory: ConversationMemory) -> None:
    model = RecordingModel()
    heavy = TokenizerCounter(lambda text: 1000 if "heavy" in text else 1)
    agent = Agent(
        model, memory=memory, conversation_id="c", max_history_tokens=500, token_counter=heavy
    )
    for text in ("light-1", "heavy-2", "light-3", "light-4"):
        agent.generate(text)
    agent.generate("last")
    assert user_texts(model.sent[-1]) == ["light-3", "light-4", "last"]


# ---- Redis: chosen from stored counts, never reading the whole history -------------------


async def test_redis_budget_window_never_reads_older_turns(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        for turn in split_turns(history(30))[1]:
            await memory.aappend("long", turn)
        # Break the oldest element: a read of the whole history would trip over it.
        redis_client.lset(KeySchema(key_prefix).turns("long"), 0, b"garbage without a header")
        with pytest.raises(CorruptDataError):
            await memory.aload("long")
        window = await memory.aload("long", max_tokens=400)
        assert user_texts(window)[-1] == "q29" and "q0" not in user_texts(window)
        assert memory.load("long", max_tokens=400) == window
        # A counter of the caller's own walks the turns newest first: no older one is read.
        words = TokenizerCounter(lambda text: len(text.split()))
        counted = await memory.aload("long", max_tokens=300, counter=words)
        intact = [m for turn in split_turns(history(30))[1][1:] for m in turn]
        assert counted == Window(None, 300, words).apply(intact) and len(counted) >= 8
        assert user_texts(counted)[-1] == "q29" and "q0" not in user_texts(counted)
    finally:
        await memory.aclose()


async def test_redis_budget_window_over_many_script_calls(redis_url: str, key_prefix: str) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    turns = [m for i in range(2600) for m in (Message.user(f"u{i}"), Message.assistant("a"))]
    try:
        await memory.aappend("many", turns)
        everything = await memory.aload("many", max_tokens=10**9)
        assert everything == turns
        some = await memory.aload("many", max_tokens=10_000)
        assert some == Window(None, 10_000).apply(turns) and 0 < len(some) < len(turns)
    finally:
        await memory.aclose()


# ---- workers: submit's option and the profile's budget ------------------------------------


async def test_the_runner_sends_the_budget_window(redis_url: str, key_prefix: str) -> None:
    proto = TurnProtocol.from_url(redis_url, prefix=key_prefix)
    model = RecordingModel()
    budgeted = Agent(model, name="budgeted", max_history_tokens=10**6)
    runner = Runner(proto, Profiles([budgeted]), RunnerConfig(worker_id="w", lease_ms=5_000))
    try:
        for i in range(4):
            await proto.submit(
                "w 1",
                f"t{i}",
                agent="budgeted",
                message=Message.user(f"m{i} " + "x " * 80),
                options={},
            )
            await runner.drain("w 1")
        assert user_texts(model.sent[-1]) == ["m0", "m1", "m2", "m3"]
        await proto.submit(
            "w 1",
            "t4",
            agent="budgeted",
            message=Message.user("m4"),
            options={"max_history_tokens": 0},
        )
        await runner.drain("w 1")
        assert user_texts(model.sent[-1]) == ["m4"]
        assert Profiles([budgeted]).windows().by_agent == {"budgeted": STORE_CHOOSES}
    finally:
        await proto.close()

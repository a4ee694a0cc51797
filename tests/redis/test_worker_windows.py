"""The history window a turn is handed out with is decided once, by its agent: a worker
that runs a whole-history profile beside a last-10 one reads 10 turns for the latter,
measured in the bytes Redis sends."""

from __future__ import annotations

import redis

from convoq import Agent, Message
from convoq.memory.redis import RedisConversationMemory
from convoq.redis import TurnEnding
from convoq.testing import RecordingModel
from convoq.window import STORE_CHOOSES, AgentWindows
from convoq.worker.profiles import Profiles
from convoq.worker.runner import Runner, RunnerConfig
from tests.support.protocol_helpers import exchange, open_protocol

CID = "windows 1"
STORED_TURNS = 3000


def sent_bytes(stats: redis.Redis) -> int:
    """What the server has sent to all its clients so far."""
    return int(stats.info("stats")["total_net_output_bytes"])


def user_texts(messages: list[Message]) -> list[str]:
    return [m.text.split()[0] for m in messages if m.role == "user"]


async def test_a_last_10_profile_reads_a_window_beside_a_whole_history_profile(
    redis_url: str, key_prefix: str
) -> None:
    whole_model, recent_model = RecordingModel(), RecordingModel()
    whole = Agent(whole_model, name="whole")  # keep_last_turns=0: the whole history
    recent = Agent(recent_model, name="recent", keep_last_turns=10)
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    stats = redis.Redis.from_url(redis_url)
    turns = [
        m
        for i in range(STORED_TURNS)
        for m in (Message.user(f"q{i} " + "x" * 100), Message.assistant("answer"))
    ]
    try:
        await memory.aappend(CID, turns)
        async with open_protocol(redis_url, key_prefix) as proto:
            config = RunnerConfig(worker_id="w", lease_ms=60_000)
            runner = Runner(proto, Profiles([whole, recent]), config)

            async def drain_bytes(tid: str, agent: str) -> int:
                await proto.submit(CID, tid, agent=agent, message=Message.user(tid), options={})
                before = sent_bytes(stats)
                report = await runner.drain(CID)
                assert report.succeeded == [tid]
                return sent_bytes(stats) - before

            recent_bytes = await drain_bytes("t-recent", "recent")
            whole_bytes = await drain_bytes("t-whole", "whole")
    finally:
        stats.close()
        await memory.aclose()
    assert user_texts(recent_model.sent[-1]) == [f"q{i}" for i in range(2990, 3000)] + ["t-recent"]
    assert len(user_texts(whole_model.sent[-1])) == STORED_TURNS + 2
    # Ten stored turns are ~1.2 KB; the whole history is ~370 KB.
    print(f"bytes read: last-10 {recent_bytes}, whole history {whole_bytes}")
    assert recent_bytes < 20_000, recent_bytes
    assert whole_bytes > 300_000, whole_bytes


async def test_each_turn_gets_its_agents_window_or_its_own(redis_url: str, key_prefix: str) -> None:
    windows = AgentWindows({"two": 2, "budget": STORE_CHOOSES}, default=0)
    async with open_protocol(redis_url, key_prefix) as proto:
        for n in range(4):
            await proto.submit(CID, f"s{n}", agent="any", message=Message.user(f"s{n}"), options={})
        asked = [("two", {}), ("budget", {}), ("other", {}), ("two", {"keep_last_turns": 3})]
        asked += [("two", {"max_history_tokens": 50}), ("two", {"keep_last_turns": 0})]
        for n, (agent, options) in enumerate(asked):
            await proto.submit(
                CID, f"t{n}", agent=agent, message=Message.user(f"t{n}"), options=options
            )
        acquired = await proto.acquire(CID, worker_id="w", lease_ms=60_000, window=windows)
        seen: dict[str, int] = {}
        while acquired is not None:
            tid = acquired.turn.turn_id
            seen[tid] = len(user_texts(acquired.history))
            ending = TurnEnding(
                fence=acquired.fence,
                lease_ms=60_000,
                window=windows,
                next_turn_id=acquired.next_turn_id,
            )
            acquired = await proto.commit(CID, tid, exchange(tid), ending)
    # The s-turns' agent is not listed: the default (all); "budget" has the store choose
    # (one turn comes along); a turn's own option wins over its agent's window, and its
    # own budget has the store choose too.
    assert seen == {
        **{"s0": 0, "s1": 1, "s2": 2, "s3": 3},
        **{"t0": 2, "t1": 1, "t2": 6, "t3": 3, "t4": 1, "t5": 9},
    }


def test_profiles_decide_each_agents_window_once() -> None:
    model = RecordingModel()
    profiles = Profiles(
        [
            Agent(model, name="all"),
            Agent(model, name="ten", keep_last_turns=10),
            Agent(model, name="budget", keep_last_turns=10, max_history_tokens=500),
        ]
    )
    assert profiles.windows() == AgentWindows(
        {"all": 0, "ten": 10, "budget": STORE_CHOOSES}, default=STORE_CHOOSES
    )


def lranges(stats: redis.Redis) -> int:
    return int(stats.info("commandstats").get("cmdstat_lrange", {}).get("calls", 0))


async def test_a_new_conversation_reads_no_history_and_one_with_only_its_lead_gets_it(
    redis_url: str, key_prefix: str
) -> None:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    stats = redis.Redis.from_url(redis_url)
    try:
        async with open_protocol(redis_url, key_prefix) as proto:
            await proto.submit("fresh", "t1", agent="a", message=Message.user("hi"), options={})
            before = lranges(stats)
            fresh = await proto.acquire("fresh", worker_id="w", lease_ms=30_000)
            # The inbox is read; the meta counts no history, so lead and turns are not.
            assert lranges(stats) - before == 1
            assert fresh is not None and fresh.history == []

            await memory.aappend("led", [Message.system("be brief")])
            await proto.submit("led", "t1", agent="a", message=Message.user("hi"), options={})
            led = await proto.acquire("led", worker_id="w", lease_ms=30_000)
            assert led is not None and led.history == [Message.system("be brief")]
            await proto.commit("led", "t1", exchange("hi"), TurnEnding(fence=led.fence))
            await proto.submit("led", "t2", agent="a", message=Message.user("more"), options={})
            again = await proto.acquire("led", worker_id="w", lease_ms=30_000)
            assert again is not None
            assert again.history == [Message.system("be brief"), *exchange("hi")]
    finally:
        await memory.aclose()
        stats.close()

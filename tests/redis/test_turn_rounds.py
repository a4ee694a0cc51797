"""What a turn costs in Redis round trips, and that the savings keep the guarantees: the
runner in this process against a real redis-server, its connections counting what they
send. Events ride along with the turn's fenced writes (in order, "done" last), checkpoints
and the commit carry the cancel flag, every step but the final answer is journaled before
the loop goes on, and the commit journals the final answer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import redis
import redis.asyncio as aioredis

from convoq import Agent, tool
from convoq.client import AsyncClient
from convoq.client.handle import AsyncTurnHandle
from convoq.messages import Message, ToolCall
from convoq.models import ModelRequest, ScriptedModel
from convoq.models.base import TextDeltaHandler
from convoq.queue.routing import route
from convoq.queue.transport import HEAD_HEADER
from convoq.redis import KeySchema, TurnProtocol
from convoq.turn_state import TurnState
from convoq.usage import Usage
from convoq.worker.profiles import Profiles
from convoq.worker.runner import Runner, RunnerConfig
from tests.support.protocol_helpers import submit_all

CID = "conv-1"
NEVER_MS = 600_000  # events wait for the next write, however slow the machine


class CountingConnection(aioredis.Connection):
    """A connection that logs the command names of each round trip it sends (read from
    the bytes sent, whoever packed them: redis-py or convoq's direct calls)."""

    rounds: ClassVar[list[list[str]]] = []

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        packed = command if isinstance(command, bytes) else b"".join(command)
        names = command_names(packed)
        # A connection's handshake is not a command of the turn: a pool may open one
        # whenever calls overlap (the direct calls keep connections of their own).
        if not set(names) <= HANDSHAKE:
            CountingConnection.rounds.append(names)
        await super().send_packed_command(command, check_health)


HANDSHAKE = {"HELLO", "AUTH", "SELECT", "CLIENT"}


def command_names(packed: bytes) -> list[str]:
    """The command name of each RESP array in ``packed``."""
    names, at = [], 0
    while at < len(packed):
        end = packed.index(b"\r\n", at)
        count, at = int(packed[at + 1 : end]), end + 2  # "*N"
        for n in range(count):
            end = packed.index(b"\r\n", at)
            size, at = int(packed[at + 1 : end]), end + 2  # "$len"
            if n == 0:
                names.append(packed[at : at + size].decode().upper())
            at += size + 2
    return names


@pytest.fixture
async def counted(redis_url: str, key_prefix: str) -> AsyncIterator[TurnProtocol]:
    """The runner's protocol; its round trips land in ``CountingConnection.rounds``."""
    pool = aioredis.ConnectionPool.from_url(redis_url, connection_class=CountingConnection)
    client = aioredis.Redis.from_pool(pool)
    yield TurnProtocol(client, KeySchema(key_prefix))
    await client.aclose()


def runner(proto: TurnProtocol, agent: Agent, flush_ms: int = NEVER_MS) -> Runner:
    config = RunnerConfig(worker_id="w-test", lease_ms=60_000, event_flush_ms=flush_ms)
    return Runner(proto, Profiles([agent]), config)


async def warm_up(proto: TurnProtocol, run: Runner, agent: str) -> None:
    """Run a turn of another conversation: scripts loaded, connections open."""
    await proto.submit("warm-up", "t0", agent=agent, message=Message.user("hi"), options={})
    assert (await run.drain("warm-up")).succeeded == ["t0"]
    CountingConnection.rounds = []


async def measured_drain(
    proto: TurnProtocol, run: Runner, agent: str, head: str | None = None
) -> list[list[str]]:
    """Drain one fresh turn "t1" of CID after a warm-up turn; return the round trips the
    drain took. ``head``: the kick's hint."""
    await warm_up(proto, run, agent)
    await proto.submit(CID, "t1", agent=agent, message=Message.user("hi there"), options={})
    CountingConnection.rounds = []
    report = await run.drain(CID, head=head)
    assert report.succeeded == ["t1"]
    return CountingConnection.rounds


async def event_types(proto: TurnProtocol, tid: str = "t1") -> list[str]:
    return [e.type for _, e in await proto.read_events(CID, tid)]


async def test_a_one_step_turn_costs_acquire_and_commit_its_events_ride_along(
    proto: TurnProtocol, counted: TurnProtocol
) -> None:
    echo = Agent(ScriptedModel(lambda r: f"seen {r.messages[-1].text}"), name="echo")

    rounds = await measured_drain(proto, runner(counted, echo), "echo", head="t1")

    # Acquire (lease + turn + history), commit (events + answer + done).
    assert rounds == [["EVALSHA"], ["EVALSHA"]]
    events = await proto.read_events(CID, "t1")
    types = [e.type for _, e in events]
    # Nobody reads the stream live: the three streamed words go as one delta event.
    assert types == ["status", "status", "text_delta", "assistant", "status", "done"]
    assert "".join(e.data["text"] for _, e in events if e.type == "text_delta") == "seen hi there"
    result = (await proto.get_turn(CID, "t1")).result
    assert result is not None
    assert {name: result[name] for name in ("text", "messages")} == {
        "text": "seen hi there",
        "messages": [Message.assistant("seen hi there", model="scripted").model_dump(mode="json")],
    }
    assert result["usage"] == Usage(requests=1).model_dump()  # one call, no tokens reported


class Recording:
    """A model answering "ok", noting the user messages of each request of CID; runs
    ``during_first`` while it answers the first of them."""

    def __init__(self, during_first: Callable[[], Awaitable[object]] | None = None) -> None:
        self.seen: list[list[str]] = []
        self.during_first = during_first

    async def __call__(self, request: ModelRequest) -> str:
        users = [m.text for m in request.messages if m.role == "user"]
        if users[-1] != "hi":  # not the warm-up turn
            self.seen.append(users)
            if self.during_first is not None and len(self.seen) == 1:
                await self.during_first()
        return "ok"


async def test_a_busy_conversation_costs_one_round_trip_per_turn(
    proto: TurnProtocol, counted: TurnProtocol
) -> None:
    model = Recording()
    run = runner(counted, Agent(ScriptedModel(model), name="bot", keep_last_turns=2))
    await warm_up(proto, run, "bot")
    turns = [f"t{n}" for n in range(1, 6)]
    await submit_all(proto, CID, *turns)
    CountingConnection.rounds = []

    report = await run.drain(CID, head="t1")

    assert report.succeeded == turns
    # Acquire hands out t1 and peeks at t2; each commit stores its turn and hands out the
    # one it was told to expect (with the next peek) in the same script call.
    assert CountingConnection.rounds == [["EVALSHA"]] * (len(turns) + 1)
    # Every turn saw its own window (the last 2 turns before it), handed out by a commit.
    assert model.seen == [
        ["t1"], ["t1", "t2"], ["t1", "t2", "t3"], ["t2", "t3", "t4"], ["t3", "t4", "t5"],
    ]  # fmt: skip
    assert [m.text for m in await proto.history(CID) if m.role == "user"] == turns
    for tid in turns:
        record = await proto.get_turn(CID, tid)
        assert (record.status, record.attempts) == ("succeeded", 1)
        assert await event_types(proto, tid) == [
            "status", "status", "text_delta", "assistant", "status", "done",
        ]  # fmt: skip
    assert not await proto.redis.exists(proto.keys.lease(CID), proto.keys.inbox(CID))


async def test_a_peeked_turn_cancelled_before_the_commit_is_skipped_with_one_more_acquire(
    proto: TurnProtocol, counted: TurnProtocol
) -> None:
    async def cancel_t2() -> None:
        assert await proto.cancel(CID, "t2") == "cancelled"

    model = Recording(during_first=cancel_t2)
    run = runner(counted, Agent(ScriptedModel(model), name="bot"))
    await warm_up(proto, run, "bot")
    await submit_all(proto, CID, "t1", "t2", "t3")
    CountingConnection.rounds = []

    report = await run.drain(CID, head="t1")

    assert report.succeeded == ["t1", "t3"]
    # The commit of t1 expected t2 but found t3 at the head: it names t3, which the runner
    # acquires under the same lease (the fallback), then commits.
    assert CountingConnection.rounds == [["EVALSHA"]] * 4
    assert model.seen == [["t1"], ["t1", "t3"]]
    record = await proto.get_turn(CID, "t2")
    assert (record.status, record.attempts) == ("cancelled", 0)
    assert await event_types(proto, "t2") == ["status", "status", "done"]
    assert [m.text for m in await proto.history(CID) if m.role == "user"] == ["t1", "t3"]
    assert not await proto.redis.exists(proto.keys.lease(CID), proto.keys.inbox(CID))


async def test_a_turn_queued_after_the_peek_is_acquired_after_the_commit(
    proto: TurnProtocol, counted: TurnProtocol
) -> None:
    async def submit_t2() -> None:
        await submit_all(proto, CID, "t2")

    model = Recording(during_first=submit_t2)
    run = runner(counted, Agent(ScriptedModel(model), name="bot"))
    await warm_up(proto, run, "bot")
    await submit_all(proto, CID, "t1")
    CountingConnection.rounds = []

    report = await run.drain(CID, head="t1")

    assert report.succeeded == ["t1", "t2"]
    # Nothing was queued behind t1 when it was handed out: its commit names t2, acquired.
    assert CountingConnection.rounds == [["EVALSHA"]] * 4
    assert model.seen == [["t1"], ["t1", "t2"]]


async def test_a_kick_names_the_head_of_an_idle_conversation(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    async with AsyncClient(redis_url, prefix=key_prefix, partitions=4, agents=["echo"]) as c:
        first = await c.submit(CID, "one", agent="echo")
        await c.submit(CID, "two", agent="echo")  # queued behind: no kick
    queue = route(CID, prefix=key_prefix, partitions=4)
    kicks = [json.loads(raw) for raw in redis_client.lrange(queue, 0, -1)]
    assert [k["headers"][HEAD_HEADER] for k in kicks] == [first.turn_id]


async def test_a_wrong_head_hint_costs_one_more_round_trip_and_nothing_else(
    proto: TurnProtocol, counted: TurnProtocol
) -> None:
    echo = Agent(ScriptedModel(lambda r: "ok"), name="echo")

    rounds = await measured_drain(proto, runner(counted, echo), "echo", head="t9")

    assert rounds == [["EVALSHA"], ["EVALSHA"], ["EVALSHA"]]  # the script named the head
    assert (await proto.get_turn(CID, "t1")).status == "succeeded"


async def test_every_step_but_the_answer_is_journaled_before_the_loop_goes_on(
    proto: TurnProtocol, counted: TurnProtocol
) -> None:
    journal = proto.keys.journal(CID, "t1")
    seen: list[list[str]] = []

    async def saved() -> list[str]:
        raw = await proto.redis.get(journal)
        return [m.role for m in TurnState.model_validate_json(raw).messages] if raw else []

    @tool
    async def lookup() -> str:
        """Look something up."""
        seen.append(await saved())
        return "found"

    async def model(request: ModelRequest) -> str | Message:
        seen.append(await saved())
        if request.messages[-1].role == "user":
            return Message.assistant("", tool_calls=[ToolCall(id="c1", name="lookup")])
        return "done"

    agent = Agent(ScriptedModel(model), tools=[lookup], name="tooled")
    rounds = await measured_drain(proto, runner(counted, agent), "tooled")

    assert seen[-3:] == [
        [],  # the first model call
        ["user", "assistant"],  # the tool runs once the model's call is journaled
        ["user", "assistant", "tool"],  # the model runs again once the result is journaled
    ]
    # Head, acquire, a checkpoint per step before the answer, commit: no reads per step.
    assert rounds == [["LINDEX"], ["EVALSHA"], ["EVALSHA"], ["EVALSHA"], ["EVALSHA"]]
    assert await event_types(proto) == [
        "status", "status", "assistant", "tool_call", "tool_result",
        "text_delta", "assistant", "status", "done",
    ]  # fmt: skip
    assert not await proto.redis.exists(journal)


async def test_a_cancel_during_the_final_model_call_ends_the_turn_cancelled(
    proto: TurnProtocol,
) -> None:
    calls: list[str] = []

    async def model(request: ModelRequest) -> str:
        calls.append(request.messages[-1].text)
        assert await proto.cancel(CID, "t1") == "stopping"
        return "too late"

    agent = Agent(ScriptedModel(model), name="bot")
    await proto.submit(CID, "t1", agent="bot", message=Message.user("hi"), options={})

    report = await runner(proto, agent).drain(CID)

    assert report.failed == ["t1"] and calls == ["hi"]
    record = await proto.get_turn(CID, "t1")
    assert record.status == "cancelled" and record.error is not None
    assert await proto.history(CID) == []
    # What the model streamed before the cancel still reaches the stream, before "done".
    assert await event_types(proto) == [
        "status", "status", "text_delta", "assistant", "status", "done",
    ]  # fmt: skip


async def test_a_rerun_of_a_turn_cancelled_while_it_ran_never_calls_the_model(
    proto: TurnProtocol,
) -> None:
    def model(_request: ModelRequest) -> str:
        raise AssertionError("the model was called for a cancelled turn")

    await proto.submit(CID, "t1", agent="bot", message=Message.user("hi"), options={})
    assert await proto.acquire(CID, worker_id="w-dead", lease_ms=60_000) is not None
    assert await proto.cancel(CID, "t1") == "stopping"
    await proto.redis.delete(proto.keys.lease(CID))  # its worker died; the lease lapsed

    report = await runner(proto, Agent(ScriptedModel(model), name="bot")).drain(CID)

    assert report.failed == ["t1"]
    assert (await proto.get_turn(CID, "t1")).status == "cancelled"


class StreamingModel:
    """Streams one delta, then answers only once a reader has seen it in the stream."""

    name = "streaming"

    def __init__(self, proto: TurnProtocol) -> None:
        self.proto = proto

    async def request(
        self, request: ModelRequest, *, on_text_delta: TextDeltaHandler | None = None
    ) -> Message:
        assert on_text_delta is not None
        await on_text_delta("partial")
        for _ in range(500):  # readiness, polled: the runner flushes in the background
            if "text_delta" in await event_types(self.proto):
                return Message.assistant("partial answer")
            await asyncio.sleep(0.01)
        raise AssertionError("the delta never reached the stream while the model ran")


async def test_deltas_of_a_long_model_call_reach_the_stream_while_it_runs(
    proto: TurnProtocol,
) -> None:
    agent = Agent(StreamingModel(proto), name="streamer")
    await proto.submit(CID, "t1", agent="streamer", message=Message.user("hi"), options={})

    report = await runner(proto, agent, flush_ms=10).drain(CID)

    assert report.succeeded == ["t1"]
    assert await event_types(proto) == [
        "status", "status", "text_delta", "assistant", "status", "done",
    ]  # fmt: skip


async def test_a_waiter_gets_the_result_in_the_round_trip_that_wakes_it(
    proto: TurnProtocol, counted: TurnProtocol
) -> None:
    echo = Agent(ScriptedModel(lambda r: f"seen {r.messages[-1].text}"), name="echo")
    await proto.submit(CID, "t1", agent="echo", message=Message.user("hi"), options={})
    handle = AsyncTurnHandle(SimpleNamespace(protocol=counted), CID, "t1")
    await counted.redis.ping()  # connected: no handshake among the rounds
    CountingConnection.rounds = []

    result, _ = await asyncio.gather(handle.wait(30), runner(proto, echo).drain(CID))

    assert result.text == "seen hi"
    # The latest event id, then the record (a plain pipeline: no MULTI/EXEC), then blocking
    # reads alone: the entry that ends the turn carries the record's live fields, so
    # nothing is read after the "done" event arrived.
    assert CountingConnection.rounds[0] == ["XREVRANGE", "HGETALL"]
    assert all(r == ["XREAD"] for r in CountingConnection.rounds[1:])
    assert (result.status, result.attempts) == ("succeeded", 1)


async def test_a_waiter_on_a_turn_it_queued_blocks_on_the_stream_at_once(
    proto: TurnProtocol, counted: TurnProtocol
) -> None:
    echo = Agent(ScriptedModel(lambda r: f"seen {r.messages[-1].text}"), name="echo")
    message = Message.user("hi")
    stored = await proto.submit(CID, "t1", agent="echo", message=message, options={})
    handle = AsyncTurnHandle(SimpleNamespace(protocol=counted), CID, "t1")
    handle.queued_as("echo", message, {}, stored)
    await counted.redis.ping()
    CountingConnection.rounds = []

    result, _ = await asyncio.gather(handle.wait(30), runner(proto, echo).drain(CID))

    # submit answered with the "queued" event's id: no round trip reads it back, the
    # first one already blocks on what comes after it.
    assert stored.event_id is not None
    assert all(r == ["XREAD"] for r in CountingConnection.rounds)
    assert (result.text, result.attempts) == ("seen hi", 1)
    assert result.turn == [message, Message.assistant("seen hi", model="scripted")]
    # The record the waiter started from is the stored one, as read back.
    record = await proto.get_turn(CID, "t1")
    assert record.created_ms == stored.created_ms
    assert record.input == message

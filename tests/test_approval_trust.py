"""Approvals a person can trust: a call whose arguments do not fit its tool goes back to
the model as a tool error instead of waiting for anyone (in process, on a worker, and for
an MCP server's tool against the schema it listed); the
same decision twice is one decision (no second resume is sent, no 409 for a retry), only
another decision on a decided call conflicts; a parked turn shows the usage of the model
calls it made so far (client and gateway)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis

from convoq import Agent, Client, Message, ToolCall, tool
from convoq.errors import CorruptDataError, ProtocolError
from convoq.memory import InMemoryConversationMemory, RedisConversationMemory
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel
from convoq.redis import TurnProtocol
from convoq.redis.keys import KeySchema
from convoq.turn_state import TurnState
from tests.support.approval_agents import CALL_USAGE
from tests.support.gateway import GatewayProcess, module_gateway
from tests.support.models import call_tool_then_answer
from tests.support.protocol_helpers import open_protocol, submit_all
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool, module_pool

pool = module_pool(1, agents="tests.support.approval_agents")
gateway = module_gateway()

ran: list[Any] = []


@tool(requires_approval=True)
def refund(amount: int, order: str) -> str:
    """Refund an order."""
    ran.append((amount, order))
    return f"refunded {amount} on {order}"


def _refunder(arguments: dict[str, Any]) -> Any:
    def answer(request: ModelRequest) -> str | Message:
        last = request.messages[-1]
        if last.role == MessageRole.TOOL:
            return f"the tool said: {last.text}"
        return Message.assistant("", [ToolCall(id="r1", name="refund", arguments=arguments)])

    return answer


def _agent(arguments: dict[str, Any], **options: Any) -> Agent:
    ran.clear()
    return Agent(ScriptedModel(_refunder(arguments)), memory=InMemoryConversationMemory(),
                 conversation_id="shop", tools=[refund], **options)  # fmt: skip


@pytest.mark.parametrize(
    "arguments",
    [{"amount": "lots", "order": "A-1"}, {"amount": 5}, {"amount": 5, "order": "A-1", "x": 1}],
    ids=["wrong-type", "missing", "extra"],
)
def test_arguments_that_do_not_fit_go_back_to_the_model_without_asking_anyone(
    arguments: dict[str, Any],
) -> None:
    r = _agent(arguments).generate("refund my order")
    assert r.status == "completed" and r.pending_approvals == []
    assert r.text.startswith("the tool said: Error: ToolError: invalid arguments for tool 'refund'")
    assert ran == []
    [result] = [m for m in r.turn if m.role == MessageRole.TOOL]
    assert result.tool_call_id == "r1"


def test_an_agent_policy_never_sees_arguments_that_do_not_fit() -> None:
    seen: list[dict[str, Any]] = []

    def over_100(ctx: Any, arguments: dict[str, Any]) -> bool:
        seen.append(arguments)
        return int(arguments["amount"]) > 100

    refund_free = Agent(
        ScriptedModel(_refunder({"amount": "lots", "order": "A-1"})),
        memory=InMemoryConversationMemory(), conversation_id="shop",
        tools=[tool(refund.fn)], approval_policy=over_100,
    )  # fmt: skip
    r = refund_free.generate("refund")
    # Before, the policy raised on "lots" and failed closed: the call waited for a person.
    assert r.status == "completed" and "invalid arguments" in r.text
    assert seen == []


def test_arguments_that_fit_still_wait_for_approval() -> None:
    r = _agent({"amount": 5, "order": "A-1"}).generate("refund")
    assert r.status == "awaiting_approval"
    assert [c.arguments for c in r.pending_approvals] == [{"amount": 5, "order": "A-1"}]
    assert ran == []


def test_an_mcp_call_that_does_not_fit_the_listed_schema_reaches_no_one(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    from convoq.mcp import stdio_server
    from tests.support.mcp_servers import seen, stdio_args

    log = tmp_path / "mcp.log"
    server = stdio_server("t", requires_approval=True, **stdio_args(log))
    model = ScriptedModel(call_tool_then_answer("t__add", {"a": "lots", "b": 3}))
    r = Agent(model, mcp_servers=[server]).generate("add")
    assert r.status == "completed" and r.pending_approvals == []
    assert r.text.startswith("tool said: Error: ToolError: invalid arguments for tool 't__add': a:")
    assert seen(log) == []  # neither a person nor the server was asked
    fits = Agent(ScriptedModel(call_tool_then_answer("t__add", {"a": 2, "b": 3})),
                 mcp_servers=[server]).generate("add")  # fmt: skip
    assert fits.status == "awaiting_approval"


def _cid() -> str:
    return f"trust-{uuid.uuid4().hex[:8]}"


@pytest.mark.slow
def test_on_a_worker_a_misfit_call_is_a_tool_error_not_a_parked_turn(
    client: Client, pool: WorkerPool, r: redis.Redis
) -> None:
    cid = _cid()
    handle = client.submit(cid, json.dumps({"amount": "lots", "order": "A-1"}), agent="refunder")
    result = handle.wait(30)  # settles: a parked turn would be answered as awaiting_approval
    assert result.status == "succeeded" and result.pending_approvals == []
    assert result.text.startswith("refund: Error: ToolError: invalid arguments for tool 'refund'")
    assert "amount" in result.text
    assert r.lrange(f"{pool.prefix}:test:refunds", 0, -1) == []
    assert result.decisions == {}


@pytest.mark.slow
def test_a_parked_turn_shows_the_usage_of_its_model_calls_so_far(
    client: Client, gateway: GatewayProcess
) -> None:
    cid = _cid()
    handle = client.submit(
        cid, json.dumps({"amount": 5, "order": "A-1"}), agent="refunder", metadata={"user": "ada"}
    )
    parked = handle.wait(30)
    assert parked.status == "awaiting_approval"
    assert parked.usage == CALL_USAGE
    assert handle.result().usage == CALL_USAGE
    with gateway.client("reader") as http:
        view = http.get(f"/v1/conversations/{cid}/turns/{handle.turn_id}").json()
    assert view["status"] == "awaiting_approval"
    assert view["usage"] == CALL_USAGE.model_dump()
    client.discard(handle)


def _kicks(r: redis.Redis, prefix: str) -> int:
    """Kick messages waiting in the broker's queues of ``prefix`` (no worker consumes
    them: the test's prefix has none)."""
    return sum(int(r.llen(key)) for key in r.keys(f"{prefix}.p*") if r.type(key) == b"list")


async def _park(url: str, prefix: str, cid: str, *call_ids: str) -> None:
    """A turn of ``cid`` parked on ``call_ids``, as a worker parks one."""
    async with open_protocol(url, prefix) as proto:
        await _park_with(proto, cid, *call_ids)


async def _park_with(proto: TurnProtocol, cid: str, *call_ids: str) -> None:
    await submit_all(proto, cid, "t1")
    taken = await proto.acquire(cid, worker_id="w1", lease_ms=30_000)
    assert taken is not None
    calls = [ToolCall(id=c, name="refund", arguments={"amount": 5}) for c in call_ids]
    state = TurnState(
        messages=[taken.turn.input, Message.assistant("", tool_calls=calls)],
        steps=1,
        pending=calls,
    )
    await proto.park(cid, "t1", fence=taken.fence, state=state, approval_ttl_ms=60_000)


async def _take(url: str, prefix: str, cid: str) -> None:
    """A worker takes the resumed turn (it runs now: no longer awaiting approval)."""
    async with open_protocol(url, prefix) as proto:
        assert await proto.acquire(cid, worker_id="w2", lease_ms=30_000) is not None


@pytest.fixture
def bare_client(redis_server: RedisServer, key_prefix: str) -> Iterator[Client]:
    """A client of a prefix no worker serves: the kicks it sends stay in the broker."""
    with Client(redis_server.url, prefix=key_prefix) as c:
        yield c


def test_approving_twice_is_one_decision_and_one_resume(
    bare_client: Client, redis_server: RedisServer, key_prefix: str, r: redis.Redis
) -> None:
    asyncio.run(_park(redis_server.url, key_prefix, "shop", "c1"))
    handle = bare_client.handle("shop", "t1")
    assert bare_client.approve(handle, "c1", by="ann") == "resume"
    first = handle.result().decisions["c1"]
    assert _kicks(r, key_prefix) == 1
    # A retry after a lost answer: the same answer, nothing written, nothing sent.
    assert bare_client.approve(handle, "c1", by="ann") == "resume"
    assert handle.result().decisions["c1"] == first
    assert _kicks(r, key_prefix) == 1
    events = r.xrange(KeySchema(key_prefix).events("shop", "t1"))
    assert [fields[b"type"] for _, fields in events].count(b"decision") == 1
    # Only another decision conflicts.
    with pytest.raises(ProtocolError, match="already decided otherwise"):
        bare_client.deny(handle, "c1")
    with pytest.raises(ProtocolError, match="already decided otherwise"):
        bare_client.approve(handle, "c1", reason="changed my mind")
    # Still the same once a worker took the resumed turn.
    asyncio.run(_take(redis_server.url, key_prefix, "shop"))
    assert handle.status() == "running"
    assert bare_client.approve(handle, "c1", by="ann") == "resume"
    assert _kicks(r, key_prefix) == 1
    with pytest.raises(ProtocolError, match="already decided otherwise"):
        bare_client.deny(handle, "c1")


def test_a_repeated_decision_while_other_calls_wait_answers_pending(
    bare_client: Client, redis_server: RedisServer, key_prefix: str, r: redis.Redis
) -> None:
    asyncio.run(_park(redis_server.url, key_prefix, "shop", "a", "b"))
    handle = bare_client.handle("shop", "t1")
    assert bare_client.deny(handle, "a", reason="too much") == "pending"
    assert bare_client.deny(handle, "a", reason="too much") == "pending"
    assert _kicks(r, key_prefix) == 0
    assert bare_client.approve(handle, "b") == "resume"
    assert bare_client.approve(handle, "b") == "resume"
    assert _kicks(r, key_prefix) == 1


@pytest.mark.slow
def test_over_http_the_same_decision_twice_is_a_success_and_another_a_409(
    client: Client, gateway: GatewayProcess
) -> None:
    cid = _cid()
    handle = client.submit(cid, json.dumps({"amount": 7, "order": "B-2"}), agent="refunder")
    [call] = handle.wait(30).pending_approvals
    path = f"/v1/conversations/{quote(cid, safe='')}/turns/{handle.turn_id}/approvals/{call.id}"
    with gateway.client("approver") as http:
        first = http.post(path, json={"decision": "approve", "reason": "ok"})
        assert first.status_code == 200, first.text
        assert first.json()["outcome"] == "resume"
        again = http.post(path, json={"decision": "approve", "reason": "ok"})
        assert again.status_code == 200, again.text
        assert again.json()["outcome"] == "resume"
        assert again.json()["decision"] == first.json()["decision"]
        done = handle.wait(30, until="final")
        assert done.text == "refund: refunded 7 on B-2"
        # After the turn finished too: a retry that arrives late is still no error.
        late = http.post(path, json={"decision": "approve", "reason": "ok"})
        assert late.status_code == 200, late.text
        assert late.json()["decision"] == first.json()["decision"]
        assert late.json()["turn"]["status"] == "succeeded"
        other = http.post(path, json={"decision": "deny"})
        assert other.status_code == 409
        assert "already decided otherwise" in other.json()["detail"]


def test_a_stored_decision_that_does_not_parse_is_corrupt_data_and_nothing_is_written(
    redis_server: RedisServer, key_prefix: str, r: redis.Redis
) -> None:
    asyncio.run(_park(redis_server.url, key_prefix, "shop", "c1", "c2"))
    keys = KeySchema(key_prefix)
    r.hset(keys.turn("shop", "t1"), "decision:c1", "not json")
    before = r.xlen(keys.events("shop", "t1"))

    async def decide() -> None:
        async with open_protocol(redis_server.url, key_prefix) as proto:
            await proto.decide("shop", "t1", call_id="c1", approved=True)

    with pytest.raises(CorruptDataError, match="does not parse"):
        asyncio.run(decide())
    assert r.xlen(keys.events("shop", "t1")) == before
    assert r.hget(keys.turn("shop", "t1"), "resume") == b"0"


def test_a_stored_turn_that_does_not_parse_is_left_out_of_the_conversation_shown(
    redis_server: RedisServer, key_prefix: str, r: redis.Redis
) -> None:
    keys = KeySchema(key_prefix)

    memory = RedisConversationMemory(redis_server.url, prefix=key_prefix)
    memory.append("shop", [Message.user("first"), Message.assistant("one")])
    memory.append("shop", [Message.user("second"), Message.assistant("two")])
    memory.close()

    async def listed() -> list[Any]:
        async with open_protocol(redis_server.url, key_prefix) as proto:
            await _park_with(proto, "shop", "c1")
            turns = keys.turns("shop")  # damaged while the turn waits
            r.linsert(turns, "BEFORE", r.lindex(turns, 1), b"garbage without a header")
            return await proto.parked_turns()

    [parked] = asyncio.run(listed())
    assert [m.text for m in parked.recent] == ["first", "one", "second", "two"]

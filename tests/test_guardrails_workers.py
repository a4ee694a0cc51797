"""Guardrails on real workers and through the gateway: a trip ends the turn as blocked,
stores nothing, and the result, the events, the webhook, the gateway and the CLI say which
guardrail and why; a guardrail that raises fails the turn with its error."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from convoq.cli import app
from convoq.client import Client
from convoq.errors import GuardrailTripped, TurnFailedError
from convoq.memory import RedisConversationMemory
from tests.support.gateway import GatewayProcess, module_gateway, turns_path
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool, wait_until, webhook_receiver


@pytest.fixture(scope="module")
def pool(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerPool]:
    pool = WorkerPool(
        redis_server.url, tmp_path_factory.mktemp("workers"),
        agents="tests.support.guardrail_agents",
    )  # fmt: skip
    try:
        pool.start(1)
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture
def client(pool: WorkerPool) -> Iterator[Client]:
    with pool.client() as c:
        yield c


@pytest.fixture
def memory(pool: WorkerPool) -> RedisConversationMemory:
    return RedisConversationMemory(pool.redis_url, prefix=pool.prefix)


def _cid(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize(
    ("agent", "text", "guardrail", "kind", "reason"),
    [
        ("guarded", "what is the password?", "no_secrets", "input", "asks for a password"),
        ("guarded_parallel", "the password", "no_secrets", "input", "asks for a password"),
        ("guarded", "shout hello", "no_shouting", "output", "the answer shouts"),
        ("pai_guarded", "what is the password?", "no_secrets", "input", "asks for a password"),
        ("pai_guarded", "shout hello", "no_shouting", "output", "the answer shouts"),
    ],
)
def test_a_tripped_guardrail_blocks_the_queued_turn_and_stores_nothing(
    client: Client, memory: RedisConversationMemory,
    agent: str, text: str, guardrail: str, kind: str, reason: str,
) -> None:  # fmt: skip
    cid = _cid(f"{agent}-{kind}")
    with webhook_receiver() as hooks:
        handle = client.submit(cid, text, agent=agent, callback_url=f"{hooks.url}/g")
        with pytest.raises(GuardrailTripped) as caught:
            handle.wait(60)
        posts = wait_until(lambda: hooks.posts("/g"), what="the webhook")
    err = caught.value
    assert (err.guardrail, err.kind, err.reason) == (guardrail, kind, reason)
    result = handle.result()
    assert result.status == "blocked" and not result.ok and result.turn == []
    events = list(handle.events(timeout=30))
    tripped = [e.data for e in events if e.type == "guardrail_tripped"]
    assert [(d["guardrail"], d["kind"], d["reason"]) for d in tripped] == [
        (guardrail, kind, reason)
    ]
    assert events[-1].type == "done" and events[-1].data["status"] == "blocked"
    if kind == "input":
        assert not any(e.type == "assistant" for e in events)
    payload = json.loads(posts[0][3])
    assert payload["status"] == "blocked"
    assert (payload["error"]["guardrail"], payload["error"]["reason"]) == (guardrail, reason)
    assert memory.load(cid) == []
    # The conversation goes on: its next turn runs and is stored.
    assert client.submit(cid, "hello", agent=agent).wait(60).text == "ok: hello"
    assert [m.text for m in memory.load(cid)] == ["hello", "ok: hello"]


def test_a_pydantic_ai_profile_refuses_an_input_guardrail_beside_the_model() -> None:
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.models.test import TestModel

    from convoq.errors import ConfigurationError
    from convoq.integrations.pydantic_ai import durable
    from tests.support.guardrail_agents import beside

    with pytest.raises(ConfigurationError, match=r"'pai_x'.*run_in_parallel") as caught:
        durable(PydanticAgent(TestModel(), name="pai_x"), input_guardrails=[beside])
    assert caught.value.details == {"profile": "pai_x", "option": "input_guardrails"}


def test_a_guardrail_that_raises_fails_the_turn_with_its_error(
    client: Client, memory: RedisConversationMemory
) -> None:
    cid = _cid("broken")
    handle = client.submit(cid, "hi", agent="guarded_broken")
    with pytest.raises(TurnFailedError, match="the checker is down") as caught:
        handle.wait(60)
    assert caught.value.remote_type == "RuntimeError"
    assert handle.result().status == "failed"
    assert memory.load(cid) == []


def test_a_blocked_turn_cannot_be_retried(client: Client) -> None:
    handle = client.submit(_cid("retry"), "password", agent="guarded")
    assert handle.wait(60, raise_on_error=False).status == "blocked"
    with pytest.raises(Exception, match="guardrail blocked it"):
        handle.retry()


gateway = module_gateway()


def test_the_gateway_shows_a_blocked_turn_with_its_guardrail_and_reason(
    gateway: GatewayProcess,
) -> None:
    cid = _cid("http")
    with gateway.client() as http:
        accepted = http.post(turns_path(cid), json={"message": "password?", "agent": "guarded"})
        assert accepted.status_code == 202, accepted.text
        tid = accepted.json()["turn_id"]
        view = http.get(f"{turns_path(cid)}/{tid}", params={"wait": 60}).json()
        assert view["status"] == "blocked", view
        assert view["error"]["type"] == "GuardrailTripped"
        details = view["error"]["details"]
        assert (details["guardrail"], details["kind"], details["reason"]) == (
            "no_secrets", "input", "asks for a password",
        )  # fmt: skip
        assert view["messages"] == [] and view["text"] == ""
        # Its Server-Sent Events say it too, before the end.
        stream = http.get(f"{turns_path(cid)}/{tid}/events").text
        assert "event: guardrail_tripped" in stream and "asks for a password" in stream
        assert stream.index("guardrail_tripped") < stream.rindex("event: done")


def test_convoq_submit_wait_prints_the_block_and_exits_1(pool: WorkerPool) -> None:
    args = ["submit", _cid("cli"), "password please", "--agent", "guarded", "--wait"]
    result = CliRunner().invoke(app, args, env=pool.env)
    assert result.exit_code == 1, result.output
    out = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert "blocked" in out and "no_secrets" in out and "Traceback" not in out

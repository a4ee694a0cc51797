"""Typed outputs and model settings on real workers: submit-level settings and output
schemas reach the model (a loopback Chat Completions server records the bodies), the
result, the webhook and ``wait(output_type=...)`` carry the validated output; bad input is
refused with nothing queued."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from convoq.cli import app
from convoq.client import Client
from convoq.errors import InvalidModelSettingsError, InvalidOutputTypeError, OutputValidationError
from convoq.queue.signing import MAX_TEXT_CHARS, build_payload
from tests.support.gateway import GatewayProcess, module_gateway
from tests.support.openai_server import OpenAIServer
from tests.support.output_agents import City
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool, wait_until, webhook_receiver


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as started:
        yield started


@pytest.fixture(scope="module")
def pool(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, server: OpenAIServer
) -> Iterator[WorkerPool]:
    pool = WorkerPool(
        redis_server.url, tmp_path_factory.mktemp("workers"), agents="tests.support.output_agents"
    )
    pool.env.update(OPENAI_BASE_URL=server.url, OPENAI_API_KEY="test-key")
    try:
        pool.start(1)
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture
def client(pool: WorkerPool) -> Iterator[Client]:
    with pool.client() as c:
        yield c


def _cid(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_a_profiles_output_type_and_the_turns_settings_reach_the_model(
    client: Client, server: OpenAIServer
) -> None:
    server.reply_text('{"name": "Oslo", "population": 700000}')
    start = len(server.requests)
    with webhook_receiver() as hooks:
        handle = client.submit(
            _cid("typed"), "Which city?", agent="typed_city",
            model_settings={"temperature": 0.7, "seed": 3, "extra_body": {"user": "turn"}},
            callback_url=f"{hooks.url}/typed",
        )  # fmt: skip
        result = handle.wait(30, output_type=City)
        assert result.output == City(name="Oslo", population=700000)
        assert handle.result().output == {"name": "Oslo", "population": 700000}  # as JSON
        posts = wait_until(lambda: hooks.posts("/typed"), what="the webhook")
    payload = json.loads(posts[0][3])
    assert payload["output"] == {"name": "Oslo", "population": 700000}
    assert payload["output_truncated"] is False
    body = server.requests[start].json
    # The turn's settings over the profile's: temperature and extra_body keys from the turn,
    # max_tokens from the profile (as max_completion_tokens on this wire).
    assert (body["temperature"], body["seed"], body["max_completion_tokens"]) == (0.7, 3, 50)
    assert body["user"] == "turn"
    schema = body["response_format"]["json_schema"]
    assert schema["name"] == "City" and schema["strict"] is True
    # History keeps the assistant message as the model sent it.
    stored = client.history(handle.conversation_id)
    assert stored[-1].text == '{"name": "Oslo", "population": 700000}'


def test_an_output_schema_given_at_submit_is_asked_for_and_checked(
    client: Client, server: OpenAIServer
) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    server.reply_text('{"answer": 42}')  # does not fit: sent back once
    server.reply_text('{"answer": "42"}')
    start = len(server.requests)
    handle = client.submit(
        _cid("schema"), "The answer?", agent="chat", output_type=schema,
        model_settings={"tool_choice": "lookup", "parallel_tool_calls": False},
    )  # fmt: skip
    result = handle.wait(30)
    assert result.output == {"answer": "42"}
    first, second = server.requests[start].json, server.requests[start + 1].json
    assert first["response_format"]["json_schema"]["schema"] == schema
    assert first["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert first["parallel_tool_calls"] is False
    retry = second["messages"][-1]
    assert retry["role"] == "system" and "$.answer: 42 is not of type 'string'" in retry["content"]
    # The turn stores what was exchanged, the rejected answer and the retry prompt too.
    assert [m.role.value for m in result.turn] == ["user", "assistant", "system", "assistant"]


def test_a_pydantic_type_given_at_submit_comes_back_typed(
    client: Client, server: OpenAIServer
) -> None:
    server.reply_text('{"name": "Tromso", "population": 77000, "extra": 1}')
    server.reply_text('{"name": "Tromso", "population": 77000}')
    handle = client.submit(_cid("class"), "Which city?", agent="chat", output_type=City)
    # The worker knows no City: it checks the class's schema, closed to extra keys.
    result = handle.wait(30, output_type=City)
    assert result.output == City(name="Tromso", population=77000)
    assert "Additional properties are not allowed ('extra' was unexpected)" in result.turn[2].text


def test_a_turn_whose_answer_never_fits_fails_with_the_last_answer(client: Client) -> None:
    cid = _cid("stubborn")
    handle = client.submit(cid, "Which city?", agent="stubborn")
    with pytest.raises(OutputValidationError) as raised:
        handle.wait(30)
    assert raised.value.answer == '{"name": 3}'
    assert any("population" in e for e in raised.value.errors)
    assert client.history(cid) == []  # a failed turn stores nothing


def test_a_resumed_turn_still_answers_in_its_output_type(client: Client) -> None:
    handle = client.submit(_cid("resume"), "Publish Oslo", agent="publisher")
    parked = handle.wait(30)
    assert parked.status == "awaiting_approval"
    handle.approve(parked.pending_approvals[0].id)
    assert handle.wait(30, output_type=City).output == City(name="Oslo", population=1)


def test_wait_types_the_text_of_a_turn_that_had_no_output_type(
    client: Client, server: OpenAIServer
) -> None:
    server.reply_text('{"name": "Bergen", "population": 285000}')
    server.reply_text("Bergen, I think.")
    first = client.submit(_cid("plain"), "Which city?", agent="chat")
    assert first.wait(30).output is None  # no output type: no output
    assert first.wait(30, output_type=City).output == City(name="Bergen", population=285000)
    second = client.submit(_cid("plain"), "Which city?", agent="chat")
    with pytest.raises(OutputValidationError):
        second.wait(30, output_type=City)


def test_the_webhook_leaves_out_an_output_larger_than_its_text_limit() -> None:
    small = json.loads(build_payload(**_FINISHED, output={"a": 1}))
    assert (small["output"], small["output_truncated"]) == ({"a": 1}, False)
    big = json.loads(build_payload(**_FINISHED, output={"a": "x" * MAX_TEXT_CHARS}))
    assert (big["output"], big["output_truncated"]) == (None, True)
    assert "output" not in json.loads(build_payload(**_FINISHED))  # a turn without one


_FINISHED: dict[str, Any] = {
    "conversation_id": "c", "turn_id": "t", "status": "succeeded", "agent": "a",
    "text": "", "error": None, "finished_ms": 1,
}  # fmt: skip


def _nothing_queued(r: redis.Redis, prefix: str) -> None:
    assert r.keys(f"{prefix}:*") == []
    for index in range(4):
        assert r.llen(f"{prefix}.p{index}") == 0


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"model_settings": {"temperature": 9}}, InvalidModelSettingsError),
        ({"model_settings": {"max_tokens": "many"}}, InvalidModelSettingsError),
        ({"model_settings": {"tool_choice": "no such tool!"}}, InvalidModelSettingsError),
        ({"model_settings": {"extra_body": {"x": "y" * 20000}}}, InvalidModelSettingsError),
        ({"model_settings": {"colour": "red"}}, InvalidModelSettingsError),
        ({"model_settings": ["temperature", 1]}, InvalidModelSettingsError),
        ({"output_type": {"type": "array"}}, InvalidOutputTypeError),
        ({"output_type": {"type": "object", "not": {}}}, InvalidOutputTypeError),
        ({"output_type": "City"}, InvalidOutputTypeError),
        ({"output_type": int}, InvalidOutputTypeError),
    ],
)
def test_bad_settings_and_schemas_are_refused_and_nothing_is_queued(
    redis_url: str, redis_client: redis.Redis, key_prefix: str,
    options: dict[str, Any], error: type[Exception],
) -> None:  # fmt: skip
    with (
        Client(redis_url, prefix=key_prefix, partitions=4, agents=["chat"]) as c,
        pytest.raises(error) as raised,
    ):
        c.submit("c1", "hello", agent="chat", **options)
    assert str(raised.value)
    _nothing_queued(redis_client, key_prefix)


def test_submit_keeps_settings_and_the_output_spec_in_the_record(
    redis_url: str, key_prefix: str
) -> None:
    with Client(redis_url, prefix=key_prefix, partitions=4, agents=["chat"]) as c:
        handle = c.submit(
            "c1", "hello", agent="chat", model_settings={"temperature": 0.5}, output_type=City
        )
        options = handle.record().options
    assert options["model_settings"] == {"temperature": 0.5}
    assert options["output"]["name"] == "City"
    assert options["output"]["json_schema"]["required"] == ["name", "population"]


# -- the gateway and the command line -----------------------------------------------------
gateway = module_gateway()


def test_the_gateway_takes_settings_and_a_schema_and_shows_the_output(
    gateway: GatewayProcess, server: OpenAIServer, pool: WorkerPool, redis_client: redis.Redis
) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    server.reply_text('{"ok": true}')
    start = len(server.requests)
    cid = _cid("http")
    with gateway.client() as http:
        body = {"message": "OK?", "agent": "chat", "output_schema": schema,
                "model_settings": {"top_p": 0.25}}  # fmt: skip
        accepted = http.post(f"/v1/conversations/{cid}/turns", json=body)
        assert accepted.status_code == 202, accepted.text
        tid = accepted.json()["turn_id"]
        view = http.get(f"/v1/conversations/{cid}/turns/{tid}", params={"wait": 30}).json()
        assert view["status"] == "succeeded" and view["output"] == {"ok": True}
        assert server.requests[start].json["top_p"] == 0.25
        # Bad settings or schema: problem+json naming the error, nothing written.
        bad_cid = _cid("http-bad")
        for bad in ({"model_settings": {"top_p": 3}}, {"output_schema": {"type": "string"}}):
            refused = http.post(
                f"/v1/conversations/{bad_cid}/turns", json={"message": "x", "agent": "chat", **bad}
            )
            assert refused.status_code == 422, refused.text
            assert refused.headers["content-type"] == "application/problem+json"
            # The body's schema refuses them (the document states the same limits).
            problem = refused.json()
            assert problem["title"] == "ValidationError"
            assert next(iter(bad)) in refused.text
    assert list(redis_client.scan_iter(match=f"{pool.prefix}:{{{bad_cid}}}*")) == []


def test_convoq_submit_takes_settings_and_a_schema(
    pool: WorkerPool, server: OpenAIServer, redis_client: redis.Redis
) -> None:
    runner = CliRunner()
    schema = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}})
    server.reply_text('{"n": 7}')
    start = len(server.requests)
    cid = _cid("cli")
    args = ["submit", cid, "A number?", "--agent", "chat", "--temperature", "0.5",
            "--model-settings", '{"seed": 5, "temperature": 1.0}', "--output-schema", schema,
            "--wait"]  # fmt: skip
    result = runner.invoke(app, args, env=pool.env)
    assert result.exit_code == 0, result.output
    assert "succeeded" in result.output and '{"n": 7}' in result.output
    body = server.requests[start].json
    # --temperature wins over the same key in --model-settings.
    assert (body["temperature"], body["seed"]) == (0.5, 5)
    assert body["response_format"]["json_schema"]["schema"] == json.loads(schema)
    bad_cid = _cid("cli-bad")
    for bad in (["--temperature", "7"], ["--model-settings", "{nope"],
                ["--model-settings", "[1]"], ["--output-schema", '{"type": "array"}']):  # fmt: skip
        refused = runner.invoke(app, ["submit", bad_cid, "x", "--agent", "chat", *bad],
                                env=pool.env)  # fmt: skip
        assert refused.exit_code == 2  # a usage mistake, checked before connecting
        message = refused.output + (refused.stderr if refused.stderr_bytes is not None else "")
        assert "Traceback" not in message and ("model-settings" in message or "schema" in message
                                               or "model_settings" in message)  # fmt: skip
    assert list(redis_client.scan_iter(match=f"{pool.prefix}:{{{bad_cid}}}*")) == []

"""A failed turn retried as the same turn, through the client, the HTTP gateway and the
command line, on a real worker process: it runs again at the back of its conversation's
line, the steps its journal holds are not run again (its tool, a payment API that dedupes
on the idempotency key, executed once), its handle's wait and events follow it again, a
turn that did not fail is refused and nothing changes, and a request sent twice retries
once.

``flaky`` calls its tool, then its model fails while ``broken:<word>`` is set: the turn
fails after the tool ran; the test "fixes" the model and retries."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import httpx
import pytest
import redis
from typer.testing import CliRunner

from convoq.cli import app
from convoq.client import Client, TurnHandle
from convoq.errors import ModelError, TurnNotRetryableError
from convoq.messages import MessageRole
from tests.support.gateway import GatewayProcess, module_gateway, turns_path
from tests.support.rerun_agents import rerun_key
from tests.support.workers import WorkerPool, module_pool, wait_until, webhook_receiver

pytestmark = pytest.mark.slow

pool = module_pool(1, agents="tests.support.rerun_agents")
gateway = module_gateway()


def _failed_turn(
    client: Client, pool: WorkerPool, r: redis.Redis
) -> tuple[str, str, Callable[[], None]]:
    """A conversation whose first turn failed after its tool ran, and a later turn that
    succeeded meanwhile; returns its id, the failed turn's id and the fix of its model."""
    word = uuid.uuid4().hex[:8]
    cid = f"retry-{word}"
    r.set(rerun_key(pool.prefix, "broken", word), 1)
    failing = client.submit(cid, f"{word} pay", agent="flaky")
    later = client.submit(cid, f"{word} later", agent="echo")
    failed = failing.wait(30, raise_on_error=False)
    assert failed.status == "failed" and isinstance(failed.error, ModelError)
    assert later.wait(30).text == f"seen: {word} later"
    return cid, failing.turn_id, lambda: r.delete(rerun_key(pool.prefix, "broken", word))


def _users(client: Client, cid: str) -> list[str]:
    return [m.text.split(" ", 1)[1] for m in client.history(cid) if m.role == MessageRole.USER]


def _executions(pool: WorkerPool, r: redis.Redis, cid: str) -> list[bytes]:
    return r.lrange(rerun_key(pool.prefix, "executions", cid), 0, -1)


def test_a_retried_turn_succeeds_as_itself_after_the_later_turns(
    client: Client, pool: WorkerPool, r: redis.Redis
) -> None:
    cid, tid, fix = _failed_turn(client, pool, r)
    handle = client.handle(cid, tid)
    fix()
    retried = client.retry(handle)
    assert isinstance(retried, TurnHandle)
    assert (retried.turn_id, retried.repeated) == (tid, False)
    result = handle.wait(30)  # the handle that saw it fail follows it again
    assert result.text == f"charged: {cid[6:]} pay"
    assert (result.retries, result.attempts) == (1, 2)
    assert _users(client, cid) == ["later", "pay"]  # its answer comes after the later turn
    assert len(_executions(pool, r, cid)) == 1  # the journaled tool result was replayed
    word = cid[6:]
    calls = [c.decode() for c in r.lrange(rerun_key(pool.prefix, "model_calls", word), 0, -1)]
    assert calls == ["user", "tool", "tool"]  # no model call the journal holds was made again
    events = list(handle.events(timeout=10))
    types = [e.type for e in events]
    assert types.count("done") == 2 and types[-1] == "done"
    assert events[-1].data == {"status": "succeeded"}
    assert types[types.index("done") + 1] == "retried"
    assert [e.data for e in events if e.type == "resumed"] == [{"reason": "retried", "attempt": 2}]


def test_retrying_a_turn_that_did_not_fail_is_refused_and_changes_nothing(
    client: Client, pool: WorkerPool, r: redis.Redis
) -> None:
    done = client.submit(f"ok-{uuid.uuid4().hex[:8]}", "fine", agent="echo")
    assert done.wait(30).ok
    key = f"{pool.prefix}:{{{done.conversation_id}}}:turn:{done.turn_id}"
    before = r.hgetall(key)
    with pytest.raises(TurnNotRetryableError) as refused:
        client.retry(done)
    assert refused.value.details["status"] == "succeeded"
    assert "is succeeded, not failed" in refused.value.message
    assert "submit a new turn" in refused.value.message
    assert r.hgetall(key) == before
    assert [e.type for e in done.events(timeout=5)].count("done") == 1


def test_a_retry_sent_twice_with_one_key_retries_once(
    client: Client, pool: WorkerPool, r: redis.Redis
) -> None:
    cid, tid, fix = _failed_turn(client, pool, r)
    fix()
    handle = client.handle(cid, tid)
    assert not client.retry(handle, idempotency_key="once").repeated
    assert client.retry(handle, idempotency_key="once").repeated
    assert handle.wait(30).retries == 1
    assert client.retry(handle, idempotency_key="once").repeated  # still the same request
    assert [e.type for e in handle.events(timeout=10)].count("retried") == 1
    assert _users(client, cid) == ["later", "pay"]
    assert len(_executions(pool, r, cid)) == 1


def test_a_retried_turn_with_a_callback_is_called_back_again_when_it_ends(
    client: Client, pool: WorkerPool, r: redis.Redis
) -> None:
    word = uuid.uuid4().hex[:8]
    broken = rerun_key(pool.prefix, "broken", word)
    r.set(broken, 1)
    with webhook_receiver() as hooks:
        turn = client.submit(
            f"hook-{word}", f"{word} pay", agent="flaky", callback_url=f"{hooks.url}/done"
        )
        assert turn.wait(30, raise_on_error=False).status == "failed"
        wait_until(lambda: hooks.posts("/done"), 30, what="the callback of the failure")
        r.delete(broken)
        client.retry(turn)
        assert turn.wait(30).ok
        wait_until(lambda: len(hooks.posts("/done")) >= 2, 30, what="the callback again")
        statuses = [json.loads(body)["status"] for _, _, _, body in hooks.posts("/done")]
    assert statuses == ["failed", "succeeded"]


def _problem(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, object] = response.json()
    return body


def test_the_gateway_retries_a_failed_turn(
    gateway: GatewayProcess, client: Client, pool: WorkerPool, r: redis.Redis
) -> None:
    cid, tid, fix = _failed_turn(client, pool, r)
    retry = f"{turns_path(cid)}/{tid}/retry"
    with gateway.client("reader") as reader:
        assert _problem(reader.post(retry), 403)["status"] == 403  # scope: submit
    fix()
    with gateway.client("submitter") as http:
        first = http.post(retry, headers={"Idempotency-Key": "k1"})
        assert first.status_code == 202, first.text
        accepted = first.json()
        assert (accepted["turn_id"], accepted["status"]) == (tid, "queued")
        assert first.headers["location"] == accepted["links"]["self"]
        assert accepted["links"]["retry"] == f"{accepted['links']['self']}/retry"
        again = http.post(retry, headers={"Idempotency-Key": "k1"})  # a resend: no new retry
        assert again.status_code == 202 and again.json()["turn_id"] == tid
        view = http.get(accepted["links"]["self"], params={"wait": 30, "until": "final"})
        assert view.json()["status"] == "succeeded" and view.json()["retries"] == 1
        with http.stream("GET", accepted["links"]["events"]) as stream:
            sse = [json.loads(line[6:]) for line in stream.iter_lines() if line[:6] == "data: "]
        assert sse[-1] == {"status": "succeeded"} and {"retry": 1} in sse
        refused = _problem(http.post(retry), 409)
        assert refused["title"] == "TurnNotRetryableError"
        assert "is succeeded, not failed" in str(refused["detail"])
        missing = f"{turns_path(cid)}/no-such-turn/retry"
        assert _problem(http.post(missing), 404)["title"] == "UnknownTurnError"
    assert [e.type for e in client.handle(cid, tid).events(timeout=10)].count("retried") == 1
    assert len(_executions(pool, r, cid)) == 1


def test_the_command_line_retries_a_failed_turn(
    client: Client, pool: WorkerPool, r: redis.Redis
) -> None:
    cid, tid, fix = _failed_turn(client, pool, r)
    fix()
    runner = CliRunner()

    def run(*args: str, code: int) -> str:
        result = runner.invoke(app, list(args), env=pool.env)
        output = result.output + (result.stderr if result.stderr_bytes is not None else "")
        assert result.exit_code == code, output
        return output

    out = run("retry", cid, tid, "--wait", code=0)
    assert f"turn {tid} of {cid} queued again" in out and f"charged: {cid[6:]} pay" in out
    refused = run("retry", cid, tid, code=1)
    [line] = set(refused.strip().splitlines())  # one line (output and stderr hold it)
    assert line.startswith("error: ") and "is succeeded, not failed" in line
    assert "Traceback" not in refused
    assert "Missing argument" in run("retry", cid, code=2)
    assert _users(client, cid) == ["later", "pay"]

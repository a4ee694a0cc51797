"""RunContext on real worker processes: metadata given at submit reaches every tool of the
turn, its record, result and events; deps are made once per worker process; instructions
read the context; an approval policy parks a call, and the context (and its idempotency
key) is the same when another worker resumes the turn or reruns it after a kill."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import redis

from convoq import Client
from convoq.client import SIGNATURE_HEADER, verify_signature
from convoq.context import idempotency_key
from convoq.errors import ConvoqError
from convoq.messages import MessageRole
from tests.support.workers import (
    WEBHOOK_SECRET,
    WorkerPool,
    module_pool,
    wait_until,
    webhook_receiver,
)

pytestmark = pytest.mark.slow

pool = module_pool(
    2, agents="tests.support.context_agents", lease_ms=2000, sweep_interval_s=0.5, concurrency=4
)


def _cid() -> str:
    return f"ctx-{uuid.uuid4().hex[:8]}"


def _seen(r: redis.Redis, pool: WorkerPool, cid: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in r.lrange(f"{pool.prefix}:test:pay:{cid}", 0, -1)]


def test_a_tool_sees_its_turn_metadata_and_deps_and_instructions_read_them(
    client: Client, pool: WorkerPool, r: redis.Redis
) -> None:
    cid = _cid()
    metadata = {"user": "ada", "tenant": 7, "tags": []}
    handle = client.submit(cid, "50", agent="payer", metadata=metadata)
    result = handle.wait(30)
    assert result.text == "Greet ada. paid 50"  # no approval: 50 is not over 100
    assert result.metadata == metadata and handle.record().metadata == metadata
    [seen] = _seen(r, pool, cid)
    call_id = seen["tool_call_id"]
    assert seen == {
        "conversation_id": cid,
        "turn_id": handle.turn_id,
        "agent": "payer",
        "tool_call_id": call_id,
        "tool_name": "pay",
        "attempt": 1,
        "step": 1,
        "metadata": metadata,
        "idempotency_key": idempotency_key(cid, handle.turn_id, 1, call_id),
        "deps_made_in": seen["pid"],  # made in the worker process that ran the tool
        "pid": seen["pid"],
    }
    queued = next(iter(handle.events(timeout=10)))
    assert queued.data == {"status": "queued", "metadata": metadata}
    # More turns: each worker process made its deps once, whatever it ran.
    for n in range(6):
        assert client.submit(_cid(), str(n), agent="payer").wait(30).ok
    made = {k: int(v) for k, v in _deps_made(r, pool).items()}
    assert made and set(made.values()) == {1}


def _deps_made(r: redis.Redis, pool: WorkerPool) -> dict[bytes, bytes]:
    return {k: r.get(k) or b"" for k in r.scan_iter(match=f"{pool.prefix}:test:deps_made:*")}


def test_bad_metadata_is_refused_and_nothing_is_queued(client: Client, r: redis.Redis) -> None:
    cid = _cid()
    for bad, words in [
        ([1, 2], "JSON object"),
        ({"x": object()}, "only JSON values"),
        ({1: "x"}, "keys must be strings"),
        ({"big": "x" * 20_000}, "over the limit"),
        ({"nan": float("nan")}, "only JSON values"),
    ]:
        with pytest.raises(ConvoqError, match=words):
            client.submit(cid, "5", agent="payer", metadata=bad)  # type: ignore[arg-type]
    assert not list(r.scan_iter(match=f"*{cid}*"))


def test_an_approved_call_resumes_on_another_worker_with_its_context_and_audit(
    client: Client, pool: WorkerPool, r: redis.Redis
) -> None:
    cid = _cid()
    with webhook_receiver() as hooks:
        handle = client.submit(
            cid, "500", agent="payer", metadata={"user": "bo"}, callback_url=f"{hooks.url}/pay"
        )
        parked = handle.wait(30)
        assert parked.status == "awaiting_approval"  # the policy: over 100 needs a human
        assert _seen(r, pool, cid) == []
        [call] = parked.pending_approvals
        parker_pid = _asker_pid(r, pool, "500")
        parker = next(w for w in pool.workers if w.pid == parker_pid)
        parker.stop()  # so another worker process resumes it
        try:
            with pytest.raises(ConvoqError, match="by must name"):
                client.approve(handle, call.id, by="")
            with pytest.raises(ConvoqError, match="reason must be a str of at most"):
                client.approve(handle, call.id, by="alice", reason="x" * 3000)
            assert handle.status() == "awaiting_approval"  # the refusals changed nothing
            assert client.approve(handle, call.id, by="alice", reason="known payee") == "resume"
            result = handle.wait(30)
        finally:
            pool.workers.remove(parker)
            pool.start(1)
        assert result.text == "Greet bo. paid 500"
        [seen] = _seen(r, pool, cid)
        assert seen["pid"] != parker_pid and seen["metadata"] == {"user": "bo"}
        assert seen["idempotency_key"] == idempotency_key(cid, handle.turn_id, 1, call.id)
        decision = result.decisions[call.id]
        assert (decision.approved, decision.by, decision.reason) == (True, "alice", "known payee")
        assert decision.at_ms is not None and not decision.expired
        events = [e for e in handle.events(timeout=10) if e.type == "decision"]
        assert [(e.data["call_id"], e.data["by"]) for e in events] == [(call.id, "alice")]
        tool_message = next(m for m in client.history(cid) if m.role == MessageRole.TOOL)
        assert tool_message.decision is not None and tool_message.decision.by == "alice"
        wait_until(lambda: hooks.posts("/pay"), 30, what="the webhook")
        [(_, _, headers, body)] = hooks.posts("/pay")
        assert verify_signature(WEBHOOK_SECRET, headers[SIGNATURE_HEADER], body)
        payload = json.loads(body)
        assert payload["metadata"] == {"user": "bo"}
        assert payload["decisions"][call.id]["by"] == "alice"


def _asker_pid(r: redis.Redis, pool: WorkerPool, text: str) -> int:
    """The worker whose model asked for the call (it parked the turn)."""
    return int(r.lrange(f"{pool.prefix}:test:asked:{text}", -1, -1)[0])


def test_a_tool_rerun_after_its_worker_was_killed_has_the_same_context_and_key(
    client: Client, pool: WorkerPool, r: redis.Redis
) -> None:
    cid = _cid()
    handle = client.submit(cid, "40", agent="payer", metadata={"user": "cy", "stall": True})
    wait_until(lambda: _seen(r, pool, cid), 30, what="the tool to start")
    [first] = _seen(r, pool, cid)
    victim = next(w for w in pool.workers if w.pid == first["pid"])
    victim.kill()
    try:
        result = handle.wait(60)
    finally:
        pool.workers.remove(victim)
        pool.start(1)
    assert result.text == "Greet cy. paid 40"
    first, second = _seen(r, pool, cid)
    assert second["pid"] != first["pid"] and second["attempt"] == first["attempt"] + 1
    assert second["idempotency_key"] == first["idempotency_key"]
    assert second["metadata"] == first["metadata"] == {"user": "cy", "stall": True}
    assert second["tool_call_id"] == first["tool_call_id"] and second["step"] == first["step"]


def test_an_agent_policy_decides_on_workers_from_the_metadata(client: Client) -> None:
    admin = client.submit(_cid(), "7", agent="guarded", metadata={"user": "di", "role": "admin"})
    assert admin.wait(30).text == "Greet di. paid 7"
    guest = client.submit(_cid(), "7", agent="guarded", metadata={"user": "ed"})
    parked = guest.wait(30)
    assert parked.status == "awaiting_approval"
    [call] = parked.pending_approvals
    client.deny(guest, call.id, reason="guests may not pay")
    assert "denied this tool call" in guest.wait(30).text

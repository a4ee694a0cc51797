"""``convoq submit --metadata`` and approval decisions on the command line (who decided,
why, when), shown by ``convoq history`` and ``convoq watch``; against a real Redis and one
real worker process."""

from __future__ import annotations

import uuid

import pytest
import redis

from convoq.cli._render import print_history
from convoq.messages import Decision, Message, ToolCall
from tests.support.workers import WorkerPool, module_pool

pytestmark = pytest.mark.slow

pool = module_pool(1)


def _cid() -> str:
    return f"cli-audit-{uuid.uuid4().hex[:8]}"


def _turn_id(output: str) -> str:
    return output.split("turn ", 1)[1].split(" ", 1)[0]


def test_submit_with_metadata_and_bad_metadata_queues_nothing(run, pool: WorkerPool) -> None:  # type: ignore[no-untyped-def]
    cid = _cid()
    out = run("submit", cid, "hi", "--agent", "echo", "--metadata", '{"user": "ada"}', "--wait")
    assert "succeeded" in out
    watched = run("watch", cid, _turn_id(out), "--timeout", "10")
    assert "done: succeeded" in watched
    for bad, words in [("{nope", "--metadata must be JSON"), ("[1]", "JSON object")]:
        refused = run("submit", cid, "x", "--agent", "echo", "--metadata", bad, code=2)
        assert words in refused and "Traceback" not in refused
    store = redis.Redis.from_url(pool.redis_url)
    try:
        assert store.llen(f"{pool.prefix}:{{{cid}}}:turns") == 1  # only the first turn
    finally:
        store.close()


def test_decisions_with_who_and_why_show_in_history_and_watch(run) -> None:  # type: ignore[no-untyped-def]
    cid = _cid()
    out = run("submit", cid, "pay", "--agent", "double_approver", "--wait")
    tid = _turn_id(out)
    assert "call-a" in out and "call-b" in out
    refused = run("approve", cid, tid, "call-a", "--by", "", code=1)
    assert "by must name who decided" in refused and "Traceback" not in refused
    assert "approved" in run("approve", cid, tid, "call-a", "--by", "alice", "--reason", "ok")
    assert "denied" in run("deny", cid, tid, "call-b", "--by", "bob", "--reason", "too much")
    watched = run("watch", cid, tid, "--timeout", "30")
    assert "decision call-a: approved by alice at " in watched
    assert "decision call-b: denied by bob at " in watched
    history = run("history", cid)
    lines = [line for line in history.splitlines() if line.startswith("decision on ")]
    assert lines[0].startswith("decision on call-a (transfer): approved by alice at ")
    assert lines[0].endswith(" UTC: ok")
    assert lines[1].startswith("decision on call-b (transfer): denied by bob at ")
    assert lines[1].endswith(" UTC: too much") and len(lines) == 2


def test_history_prints_an_expired_call_as_such(capsys: pytest.CaptureFixture[str]) -> None:
    call = ToolCall(id="call-x", name="transfer", arguments={"amount": 5})
    expired = Decision(approved=False, at_ms=1_764_600_000_000, expired=True)
    messages = [
        Message.user("pay"),
        Message.assistant("", [call]),
        Message.tool_result(call, "No one approved this tool call", expired),
    ]
    print_history("c", messages)
    out = capsys.readouterr().out
    assert "decision on call-x (transfer): approval expired at 2025-12-01 14:40:00 UTC" in out

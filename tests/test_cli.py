"""The ``convoq`` command line against a real Redis and one real worker process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from convoq.cli import app
from convoq.demo import tiny_pdf, tiny_png
from convoq.queue.routing import partition_of
from convoq.redis.keys import KeySchema
from tests.support.redis_server import RedisServer
from tests.support.workers import ROOT, WorkerPool, module_pool, worker_env

pytestmark = pytest.mark.slow

pool = module_pool(1)


@pytest.fixture
def run(pool: WorkerPool):  # type: ignore[no-untyped-def]
    runner = CliRunner()

    def invoke(*args: str, code: int = 0) -> str:
        result = runner.invoke(app, list(args), env=pool.env)
        output = result.output + (result.stderr if result.stderr_bytes is not None else "")
        assert result.exit_code == code, output
        return output

    return invoke


def _cid() -> str:
    return f"cli-{uuid.uuid4().hex[:8]}"


def _turn_id(output: str) -> str:
    return output.split("turn ", 1)[1].split(" ", 1)[0]


def test_submit_wait_with_attachments_then_history_and_status(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    image, pdf = tmp_path / "dot.png", tmp_path / "notes.pdf"
    image.write_bytes(tiny_png())
    pdf.write_bytes(tiny_pdf())
    cid = _cid()
    out = run(
        "submit",
        cid,
        "first",
        "--agent",
        "echo",
        "--image",
        str(image),
        "--pdf",
        str(pdf),
        "--wait",
    )
    assert "succeeded" in out and "seen: first files: image/png" in out and "notes.pdf" in out
    out = run("submit", cid, "second", "--agent", "echo", "--wait")
    assert "seen: first | second" in out
    assert "succeeded" in run("status", cid, _turn_id(out))
    history = run("history", cid)
    assert "4 messages" in history and "[image/png" in history and "[application/pdf" in history
    assert "seen: first | second" in run("history", cid, "--last", "1")


def test_watch_streams_events_until_done(run) -> None:  # type: ignore[no-untyped-def]
    cid = _cid()
    tid = _turn_id(run("submit", cid, "watch me", "--agent", "echo"))
    out = run("watch", cid, tid, "--timeout", "30")
    assert "running" in out and "seen: watch me" in out and "done: succeeded" in out


def test_deny_from_the_command_line(run) -> None:  # type: ignore[no-untyped-def]
    cid = _cid()
    out = run("submit", cid, "pay", "--agent", "approver", "--wait")
    assert "awaiting_approval" in out and "needs approval" in out
    call_id = out.split("needs approval: ", 1)[1].split(" ", 1)[0]
    tid = _turn_id(out)
    assert "denied" in run("deny", cid, tid, call_id, "--reason", "not today")
    run("submit", cid, "next", "--agent", "echo", "--wait")
    assert "not today" in run("status", cid, tid)


def test_clear_refuses_a_busy_conversation_unless_forced(run) -> None:  # type: ignore[no-untyped-def]
    cid = _cid()
    run("submit", cid, "pay", "--agent", "approver", "--wait")  # parked: busy
    assert "error:" in run("clear", cid, code=1)
    assert "cleared" in run("clear", cid, "--force")
    assert "0 messages" in run("history", cid)


def test_cancel_and_errors_are_reported_with_exit_codes(run) -> None:  # type: ignore[no-untyped-def]
    assert "invalid conversation id" in run("submit", "bad\tid", "x", "--agent", "echo", code=1)
    assert "no agent profile" in run("submit", _cid(), "x", "--agent", "nobody", code=1)
    assert "no file" in run(
        "submit", _cid(), "x", "--agent", "echo", "--image", "/nope.png", code=1
    )
    cid = _cid()
    out = run("submit", cid, "pay", "--agent", "approver", "--wait")
    assert "cancelled" in run("cancel", cid, _turn_id(out))


def test_worker_refuses_bad_partitions_and_agent_modules(pool: WorkerPool) -> None:
    env = worker_env(pool.redis_url, pool.prefix)

    def worker(*options: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "convoq.cli", "worker", *options]
        return subprocess.run(
            command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
        )

    done = worker("--partitions", "0-99")
    assert done.returncode == 1 and "do not exist" in done.stderr
    done = worker("--agents", "no.such.module")
    assert done.returncode == 1 and "cannot import agent module" in done.stderr


def test_redis_command_runs_the_embedded_server_until_interrupted(tmp_path: Path) -> None:
    from convoq.redis import embedded

    home = tmp_path / "home"
    command = [sys.executable, "-m", "convoq.cli", "redis", "--home", str(home)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().split(": ", 1)[1].split()[0]
        client = redis.Redis.from_url(url)
        assert client.ping()
        client.close()
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(30)
        if process.stdout is not None:
            process.stdout.close()
    assert embedded.running_url(home) is None


def test_demo_runs_the_whole_stack_offline() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONVOQ_", "OPENAI_"))}
    env["COLUMNS"] = "200"
    done = subprocess.run(
        [sys.executable, "-m", "convoq.cli", "demo"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for expected in [
        "Your name is Alice.",
        "Your name is Bob.",
        "You sent me a PNG image",
        "report.pdf",
        "awaiting_approval: transfer",
        "Done: sent 20 EUR to Carol.",
        "signature valid: True",
        "status  -> running",
        "/inbox#key=",
        "SSE status -> awaiting_approval",
        "succeeded: Done: sent 5 EUR to Erin.",
        "demo finished",
    ]:
        assert expected in out, expected


def test_worker_consumes_only_the_chosen_partitions(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    pool = WorkerPool(redis_server.url, tmp_path)
    try:
        [worker] = pool.start(1, partitions="1,3")
        workers = KeySchema(pool.prefix).workers()
        info = redis.Redis.from_url(redis_server.url).hget(workers, worker.name)
        assert info is not None
        assert json.loads(info)["queues"] == [f"{pool.prefix}.p1", f"{pool.prefix}.p3"]
        cid = next(c for c in (f"part-{i}" for i in range(100)) if partition_of(c, 4) == 3)
        with pool.client() as client:
            assert client.submit(cid, "routed", agent="echo").wait(30).text == "seen: routed"
    finally:
        pool.stop_all()


def test_a_bad_setting_is_an_error_message_not_a_traceback(pool: WorkerPool) -> None:
    env = {**pool.env, "CONVOQ_PARTITIONS": "many"}
    result = CliRunner().invoke(app, ["history", "some-conversation"], env=env)
    output = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exit_code == 2, output
    assert "CONVOQ_PARTITIONS" in output and "Traceback" not in output

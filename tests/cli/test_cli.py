"""The ``convoq`` command line against a real Redis and one real worker process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from convoq._ports import free_loopback_port
from convoq.cli import app
from convoq.cli.demo import tiny_pdf, tiny_png
from convoq.client import Client
from convoq.queue.routing import partition_of
from convoq.redis.keys import KeySchema
from tests.support.redis_server import RedisServer
from tests.support.workers import ROOT, WorkerPool, module_pool, wait_until, worker_env

pytestmark = pytest.mark.slow

pool = module_pool(1)


def _cid() -> str:
    return f"cli-{uuid.uuid4().hex[:8]}"


def _turn_id(output: str) -> str:
    return output.splitlines()[0]  # submit prints the bare id first, on stdout


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
    refused = run("clear", cid, code=1)
    # The command line's own option is named, not the Python keyword.
    assert "error:" in refused and "--force" in refused and "force=True" not in refused
    assert "cleared" in run("clear", cid, "--force")
    assert "0 messages" in run("history", cid)


def test_cancel_and_errors_are_reported_with_exit_codes(run) -> None:  # type: ignore[no-untyped-def]
    assert "invalid conversation id" in run("submit", "bad\tid", "x", "--agent", "echo", code=1)
    assert "no agent profile" in run("submit", _cid(), "x", "--agent", "nobody", code=1)
    assert "no file" in run(  # a bad option value: a usage error
        "submit", _cid(), "x", "--agent", "echo", "--image", "/nope.png", code=2
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

    done = worker("--partitions", "0-99")  # a bad option value: a usage error
    assert done.returncode == 2 and "do not exist" in done.stderr
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


def test_submit_prints_the_bare_turn_id_on_stdout(pool: WorkerPool) -> None:
    cid = _cid()
    command = [CONVOQ, "submit", cid, "hello", "--agent", "echo"]
    done = subprocess.run(command, env=pool.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    tid = done.stdout.strip()  # what TID=$(convoq submit ...) holds
    assert tid and "\n" not in tid and " " not in tid
    assert f"turn {tid} queued for {cid}" in done.stderr
    with pool.client() as client:
        assert client.handle(cid, tid).wait(30).text == "seen: hello"


# -- misuse: one line and an exit code, never a traceback ---------------------------------
CONVOQ = str(Path(sys.executable).with_name("convoq"))  # the installed console script
BAD_KEYS = '[{"key": '  # CONVOQ_GATEWAY_API_KEYS that is not JSON
Case = tuple[list[str], dict[str, str], int, str]  # arguments, environment, exit code, says


def _closed_redis() -> str:
    """A Redis URL to a loopback port nothing listens on: refused at once, no wait."""
    return f"redis://127.0.0.1:{free_loopback_port()}/0"


def _every_command(export: Path) -> list[list[str]]:
    """Each subcommand that talks to Redis, with arguments that are otherwise fine."""
    return [
        ["submit", "c1", "hello", "--agent", "echo"],
        ["watch", "c1", "t1", "--timeout", "5"],
        ["status", "c1", "t1"],
        ["history", "c1"],
        ["approve", "c1", "t1", "call-1"],
        ["deny", "c1", "t1", "call-1"],
        ["cancel", "c1", "t1"],
        ["clear", "c1"],
        ["export", "c1"],
        ["import", str(export)],
    ]


def _misuses(tmp: Path, env: dict[str, str]) -> list[Case]:
    """(arguments, environment, exit code, what stderr says) for every kind of mistake."""
    export = tmp / "c1.json"
    export.write_text(json.dumps({"format": "convoq.conversation", "version": 1,
                                  "conversation_id": "c1", "messages": []}))  # fmt: skip
    closed = {**env, "CONVOQ_REDIS_URL": _closed_redis()}
    bad_keys = {**env, "CONVOQ_GATEWAY_API_KEYS": BAD_KEYS}
    usage = "Usage:"
    cases = [
        (["submit"], env, 2, usage),
        (["submit", "c1", "hi", "--bogus"], env, 2, usage),
        (["status", "c1"], env, 2, usage),
        (["history", "c1", "--last", "many"], env, 2, usage),
        (["watch", "c1", "t1", "--timeout", "soon"], env, 2, usage),
        (["approve", "c1", "t1"], env, 2, usage),
        (["demo", "--bogus"], env, 2, usage),
        (["flower", "--port", "x"], env, 2, usage),
        (["import", str(tmp / "missing.json")], env, 2, "error: no file at"),
        (["import", str(tmp)], env, 2, "is a directory"),
        (["export", "c1", "--out", str(tmp)], env, 2, "is a directory"),
        (["export", "c1", "--out", str(tmp / "no" / "c1.json")], env, 2, "does not exist"),
        (["gateway", "--port", "99999"], env, 2, "CONVOQ_GATEWAY_PORT"),
        (["redis", "--home", "/dev/null/home"], env, 1, "error: cannot use /dev/null/home"),
        (["worker"], {**env, "CONVOQ_AGENTS": ""}, 1, "error: no agent profiles"),
        (["history", "c1"], {**env, "CONVOQ_PARTITIONS": "many"}, 2, "CONVOQ_PARTITIONS"),
    ]
    more = [["worker"], ["gateway"], ["flower"], ["demo"], ["redis", "stop"]]
    for args in _every_command(export) + more:
        cases.append((args, bad_keys, 2, "error: CONVOQ_GATEWAY_API_KEYS: not valid JSON"))
    for args in _every_command(export):
        cases.append((args, closed, 1, "error: Redis does not answer"))
    return cases


def _wrong(case: Case, code: int, stdout: str, stderr: str) -> list[str]:
    """What a run of ``case`` did that a user should not see."""
    _, _, wanted_code, says = case
    lines = (stdout + stderr).splitlines()
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    wrong = [
        any(line.startswith("Traceback") for line in lines) and "a traceback",
        code != wanted_code and f"exit code {code}, not {wanted_code}",
        says not in stderr and f"no {says!r} on stderr",
        says != "Usage:" and len(errors) != 1 and f"{len(errors)} error lines",
    ]
    return [w for w in wrong if w]


@pytest.fixture
def not_redis() -> Iterator[str]:
    """A Redis URL to a loopback HTTP server: something answers, but not Redis."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"redis://127.0.0.1:{server.server_address[1]}/0"
    finally:
        server.shutdown()
        server.server_close()


def test_misuse_is_one_line_and_an_exit_code_never_a_traceback(
    pool: WorkerPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, not_redis: str
) -> None:
    monkeypatch.chdir(tmp_path)
    failures = []
    env = {**pool.env, "COLUMNS": "200"}
    wrong_server = {**env, "CONVOQ_REDIS_URL": not_redis}
    cases = [
        *_misuses(tmp_path, env),
        (["history", "c1"], wrong_server, 1, "does not speak the Redis protocol"),
    ]
    for case in cases:
        args, env, _, _ = case
        result = CliRunner().invoke(app, args, env=env)
        # An exception escaping the command is what prints a traceback in a terminal.
        escaped = result.exception is not None and not isinstance(result.exception, SystemExit)
        problems = _wrong(case, result.exit_code, result.stdout, result.stderr)
        problems += [f"raised {result.exception!r}"] if escaped else []
        if problems:
            failures.append(f"convoq {' '.join(args)}: {problems}\n{result.stderr[-800:]}")
    assert not failures, "\n\n".join(failures)


def test_misuse_in_a_terminal_prints_no_traceback(pool: WorkerPool, tmp_path: Path) -> None:
    """One mistake of each kind run as the installed command, as a user would."""
    cases = _misuses(tmp_path, {**pool.env, "COLUMNS": "200"})
    kinds = ["Usage:", "error: no file at", "not valid JSON", "error: Redis does not answer"]
    picked = [next(c for c in cases if c[3].endswith(kind)) for kind in kinds]
    failures = []
    for case in picked:
        args, env, _, _ = case
        done = subprocess.run(
            [CONVOQ, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        problems = _wrong(case, done.returncode, done.stdout, done.stderr)
        if problems:
            failures.append(f"convoq {' '.join(args)}: {problems}\n{done.stderr[-800:]}")
    assert not failures, "\n\n".join(failures)


def _until_line(process: subprocess.Popen[str], wanted: str, timeout: float = 60) -> list[str]:
    """Lines the process printed until one containing ``wanted`` (or it exited)."""
    assert process.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line.rstrip("\n"))
        if wanted in line:
            return seen
    raise AssertionError(f"no {wanted!r} in:\n" + "\n".join(seen[-40:]))


@pytest.mark.parametrize(
    ("args", "wanted"),
    [
        (["worker"], "Cannot connect to redis://"),
        (["gateway", "--port", str(free_loopback_port())], "Uvicorn running"),
        (["flower", "--port", str(free_loopback_port())], "Failed to enable events"),
    ],
)
def test_servers_keep_trying_an_unreachable_redis_without_a_traceback(
    pool: WorkerPool, tmp_path: Path, args: list[str], wanted: str
) -> None:
    env = {**pool.env, "CONVOQ_REDIS_URL": _closed_redis(), "CONVOQ_GATEWAY_API_KEYS": "[]"}
    process = subprocess.Popen(
        [CONVOQ, *args], env=env, cwd=tmp_path, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        seen = _until_line(process, wanted)
    finally:
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=60)
    lines = seen + rest.splitlines()
    assert not [line for line in lines if line.startswith("Traceback")], "\n".join(lines)


def test_a_worker_imports_the_agents_module_beside_where_it_starts(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "agents.py").write_text(
        "from convoq import Agent\n"
        "from convoq.models import ScriptedModel\n"
        "local = Agent(ScriptedModel(lambda r: 'local: ' + r.messages[-1].text), name='local')\n"
    )
    env = worker_env(redis_server.url, f"w{uuid.uuid4().hex[:10]}", agents="myapp.agents")
    env["PYTHONPATH"] = str(ROOT)  # not the folder holding myapp/
    name = f"local-{uuid.uuid4().hex[:6]}@localhost"
    log = (tmp_path / "worker.log").open("wb")
    process = subprocess.Popen(
        [CONVOQ, "worker", f"--hostname={name}"], env=env, cwd=tmp_path,
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    log.close()
    try:
        store = redis.Redis.from_url(redis_server.url)
        workers = KeySchema(env["CONVOQ_PREFIX"]).workers()
        wait_until(
            lambda: store.hexists(workers, name) or process.poll() is not None, 60, what="ready"
        )
        store.close()
        assert process.poll() is None, (tmp_path / "worker.log").read_text()
        client = Client(redis_server.url, prefix=env["CONVOQ_PREFIX"], partitions=4)
        with client:
            assert client.submit(_cid(), "hi", agent="local").wait(30).text == "local: hi"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


def test_redis_command_stops_its_server_on_sigterm(tmp_path: Path) -> None:
    from convoq.redis import embedded

    home = tmp_path / "home"
    command = [CONVOQ, "redis", "--home", str(home)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("convoq redis: unix://")
        assert embedded.running_url(home) is not None
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    assert embedded.running_url(home) is None
    assert not (home / "redis.pid").exists()


def test_redis_stop_stops_the_server_a_client_left_running(tmp_path: Path) -> None:
    from convoq.redis import embedded

    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOQ_")}
    env["CONVOQ_HOME"] = str(home)
    script = "from convoq import Client\nwith Client() as c: print(c.redis_url)"
    started = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert started.returncode == 0, started.stderr
    # The embedded server belongs to its home, not to the process that started it.
    assert embedded.running_url(home) == started.stdout.strip()
    done = subprocess.run(
        [CONVOQ, "redis", "stop"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "stopped the embedded redis-server" in done.stderr
    assert embedded.running_url(home) is None
    again = subprocess.run(
        [CONVOQ, "redis", "stop"], env=env, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0 and "was not running" in again.stderr

"""The sync/async bridge: interrupted and timed-out sync calls leave nothing running,
forked children get a working bridge, loops stop at exit, and blocking user code runs on
a pool of the configured size."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from convoq import Agent
from convoq._sync import (
    DEFAULT_BLOCKING_THREADS,
    LoopThread,
    blocking_threads,
    call_maybe_async,
    run_in_portal,
    run_sync,
    set_blocking_threads,
)
from convoq.errors import ConfigurationError
from convoq.memory import FileConversationMemory
from convoq.memory.redis import RedisConversationMemory
from convoq.models import ModelRequest, ScriptedModel
from tests.support.redis_server import RedisServer
from tests.support.workers import ROOT, running_pool, wait_until


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread("test-loop", cancel_grace_s=2.0)
    yield thread
    thread.stop()


def test_a_timed_out_call_is_cancelled_and_cleaned_up_before_it_returns(
    loop_thread: LoopThread,
) -> None:
    seen: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.05)  # cleanup that itself awaits
            seen.append("cleaned up")

    with pytest.raises(TimeoutError):
        loop_thread.run(slow(), timeout=0.1)
    assert seen == ["cleaned up"]


def test_a_swallowed_cancel_is_repeated_and_the_wait_is_bounded() -> None:
    loop_thread = LoopThread("test-stubborn", cancel_grace_s=2.0)
    cancels: list[int] = []
    release = threading.Event()

    async def stubborn() -> None:
        # Swallows every cancel, as some library paths do, until the test lets go.
        while not release.is_set():
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                cancels.append(1)

    with pytest.raises(TimeoutError):
        loop_thread.run(stubborn(), timeout=0.05)
    # It returned although the coroutine never ended, after asking more than once.
    assert len(cancels) >= 2
    release.set()
    loop_thread.stop()


async def test_cancelling_an_awaiting_caller_cancels_the_portal_coroutine_and_waits() -> None:
    seen: list[str] = []
    started = threading.Event()

    async def on_portal() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.05)
            seen.append("cleaned up")

    caller = asyncio.create_task(run_in_portal(on_portal()))
    await asyncio.to_thread(started.wait, 10)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert seen == ["cleaned up"]


@pytest.mark.parametrize(
    ("call", "backend"), [("generate", "file"), ("generate", "redis"), ("stream", "file")]
)
def test_ctrl_c_in_a_sync_call_stops_the_turn_and_stores_nothing(
    call: str, backend: str, tmp_path: Path, redis_server: RedisServer, key_prefix: str
) -> None:
    args = ["file"] if backend == "file" else ["redis", redis_server.url, key_prefix]
    command = ["-m", "tests.support.interrupted_generate", str(tmp_path), call, *args]
    child = subprocess.Popen(
        [sys.executable, *command],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: (tmp_path / "started").exists(), timeout=60, what="the model call")
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, err
    assert out.splitlines() == ["interrupted", "stored: 0", "quick"], err
    assert (tmp_path / "model_done").exists()  # the model did finish, in its thread
    memory = (
        FileConversationMemory(tmp_path / "conversations")
        if backend == "file"
        else RedisConversationMemory(redis_server.url, prefix=key_prefix)
    )
    assert [m.text for m in memory.load("interrupted")] == ["after", "quick"]


def test_the_first_sync_call_in_a_forked_child_works(
    tmp_path: Path, redis_server: RedisServer, key_prefix: str
) -> None:
    memory = RedisConversationMemory(redis_server.url, prefix=key_prefix)
    agent = Agent(ScriptedModel(lambda request: f"pid {os.getpid()}"), memory=memory)
    # The parent's bridge loop, its blocking pool and the memory's connections all exist.
    assert agent.generate("parent", conversation_id="c").text == f"pid {os.getpid()}"

    def child_body() -> str:
        return agent.generate("child", conversation_id="c").text

    written = _in_forked_child_call(child_body, tmp_path)
    assert written.startswith("pid ") and written != f"pid {os.getpid()}"
    assert [m.text for m in memory.load("c")] == ["parent", f"pid {os.getpid()}", "child", written]
    # The parent's bridge still works after its child used its own.
    assert agent.generate("again", conversation_id="c").text == f"pid {os.getpid()}"
    memory.close()


def _in_forked_child_call(fn: object, tmp_path: Path) -> str:
    out = tmp_path / "child.out"
    with warnings.catch_warnings():
        # Python 3.12+ warns that forking a threaded process is risky: the very hazard
        # the bridge handles, tested here.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            signal.alarm(20)  # a hanging bridge must not hang the suite
            out.write_text(fn())  # type: ignore[operator]
            code = 0
        except BaseException:
            out.write_text(traceback.format_exc())
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0, out.read_text()
            return out.read_text()
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child hung")


def test_loops_are_stopped_at_exit_and_their_tasks_cleaned_up(tmp_path: Path) -> None:
    marker = tmp_path / "cleaned"
    script = f"""
import asyncio
from convoq._sync import run_sync

async def background():
    try:
        await asyncio.sleep(3600)
    finally:
        open({str(marker)!r}, "w").write("cleaned up at exit")

async def start():
    asyncio.get_running_loop().create_task(background())
    await asyncio.sleep(0)

run_sync(start())
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "cleaned up at exit"
    assert done.stderr == ""


@pytest.fixture
def blocking_pool_size() -> Iterator[None]:
    yield
    set_blocking_threads(DEFAULT_BLOCKING_THREADS)


async def test_blocking_calls_overlap_up_to_the_pool_size_and_no_further(
    blocking_pool_size: None,
) -> None:
    set_blocking_threads(3)
    assert blocking_threads() == 3
    barrier = threading.Barrier(3, timeout=20)
    lock = threading.Lock()
    running, most = [0], [0]

    def blocking(n: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        barrier.wait()  # three must be in here at once, or this breaks
        with lock:
            running[0] -= 1
        return n

    assert await asyncio.gather(*(call_maybe_async(blocking, n) for n in range(9))) == list(
        range(9)
    )
    assert most[0] == 3


async def test_in_process_agents_run_as_many_sync_models_at_once_as_the_pool_has() -> None:
    n = DEFAULT_BLOCKING_THREADS  # asyncio's default executor: min(32, CPUs + 4) threads
    barrier = threading.Barrier(n, timeout=20)

    def model(request: ModelRequest) -> str:
        barrier.wait()  # breaks (ModelError) unless all n calls run at once
        return "met"

    agent = Agent(ScriptedModel(model))
    results = await asyncio.gather(*(agent.agenerate(f"q{i}") for i in range(n)))
    assert {r.text for r in results} == {"met"}


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8"])
def test_a_bad_pool_size_is_a_configuration_error(bad: object) -> None:
    with pytest.raises(ConfigurationError):
        set_blocking_threads(bad)  # type: ignore[arg-type]
    assert blocking_threads() == DEFAULT_BLOCKING_THREADS


def test_run_sync_still_returns_results_and_raises_errors() -> None:
    async def ok() -> int:
        return 7

    async def bad() -> None:
        raise ValueError("boom")

    assert run_sync(ok()) == 7
    with pytest.raises(ValueError, match="boom"):
        run_sync(bad())


@pytest.mark.slow
def test_a_client_used_before_fork_works_in_the_forked_child(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    with running_pool(redis_server.url, tmp_path, 1) as pool, pool.client() as client:
        # The parent's client has its Redis pool and Celery sender on the parent's loop.
        assert client.submit("fork-a", "parent", agent="echo").wait(30).text == "seen: parent"

        def in_child() -> str:
            return client.submit("fork-b", "child", agent="echo").wait(30).text

        assert _in_forked_child_call(in_child, tmp_path) == "seen: child"
        again = client.submit("fork-a", "parent again", agent="echo").wait(30)
        assert again.text == "seen: parent | parent again"

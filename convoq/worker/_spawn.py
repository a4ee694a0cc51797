"""Worker processes on this machine, for ``convoq demo`` and the benchmarks: start one,
wait until it has registered in Redis (its consumer runs), stop it on the way out."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

Popen = subprocess.Popen[bytes]


@contextmanager
def process(
    command: list[str], env: dict[str, str], log: Path, *, cwd: Path | None = None
) -> Iterator[Popen]:
    """``command`` running with its output appended to ``log``; on exit it gets SIGTERM
    (a warm shutdown), and SIGKILL if it is still up 30 s later."""
    with open(log, "ab") as out:
        child = subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield child
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@contextmanager
def worker_process(
    name: str,
    env: dict[str, str],
    log: Path,
    *options: str,
    registered: Callable[[], Collection[str]],
    cwd: Path | None = None,
    timeout_s: float = 60.0,
) -> Iterator[Popen]:
    """``convoq worker --hostname=name *options`` (settings from ``env``), yielded once
    ``name`` is among ``registered()`` (e.g. ``client.workers``).

    Raises:
        RuntimeError: the worker exited or did not register in ``timeout_s`` (with the
            end of its log).
    """
    command = [sys.executable, "-m", "convoq.cli", "worker", f"--hostname={name}", *options]
    with process(command, env, log, cwd=cwd) as child:
        deadline = time.monotonic() + timeout_s
        while name not in registered():
            if child.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"worker {name} did not start:\n{tail}")
            time.sleep(0.05)
        yield child

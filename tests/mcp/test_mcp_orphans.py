"""A stdio MCP server dies with the process that started it, even when that process is
killed with -9 and the server ignores the end of its stdin."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.support.mcp_servers import pid_alive
from tests.support.workers import wait_until

# A parent that starts a child through the guard, prints the child's pid and waits; the
# child ignores stdin and would run for ten minutes.
PARENT = """
import subprocess, sys, time
from convoq.mcp._dies_with_parent import wrap
command, args = wrap(sys.executable, ["-c", "import time; time.sleep(600)"])
child = subprocess.Popen([command, *args], stdin=subprocess.DEVNULL)
print(child.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_started_through_the_guard_dies_with_its_killed_parent() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert pid_alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        wait_until(lambda: not pid_alive(child), 30, what="the child to die with its parent")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()


def test_a_parent_gone_before_the_guard_is_set_leaves_no_child() -> None:
    from convoq.mcp import _dies_with_parent

    # PARENT_PID names a process that is not this one's parent: the guard exits at once.
    done = subprocess.run(
        [sys.executable, "-I", _dies_with_parent.__file__, "1", sys.executable, "-c", "print(1)"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1 and done.stdout == ""

"""Start a command that dies with the process that started it.

Run as ``python -I _dies_with_parent.py PARENT_PID COMMAND [ARGS...]``: on Linux it asks
the kernel for SIGKILL when its parent goes (``prctl(PR_SET_PDEATHSIG)``, kept across
``exec``), checks the parent is still ``PARENT_PID`` (it may have died already), then
becomes ``COMMAND``. A stdio MCP server started this way cannot outlive a worker killed
with ``-9``, even one that ignores the end of its stdin. Standard library only: it runs
before anything of convoq is imported.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def wrap(command: str, args: list[str]) -> tuple[str, list[str]]:
    """The command and arguments that run ``command`` under this guard (Linux), or them
    unchanged elsewhere."""
    if not sys.platform.startswith("linux"):
        return command, args
    return sys.executable, ["-I", os.path.abspath(__file__), str(os.getpid()), command, *args]


def main(argv: list[str]) -> None:
    parent, command = int(argv[0]), argv[1:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)  # the parent died before the guard was set: nobody will read us
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])

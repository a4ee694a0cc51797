"""What this process knows of each MCP server: its tool list (cached, marked stale when
the server announces a change), its connections (one per event loop) and its health.

No MCP SDK import here: a worker reads health and closes connections through this
module whether or not any profile uses MCP.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from convoq.mcp.config import MCPServer


@dataclass
class ServerState:
    """One server, in this process (a forked child starts afresh: pipes and sockets of
    the parent's sessions are no use to it)."""

    pid: int
    tools: list[Any] | None = None  # convoq tools as last listed
    stale: bool = True
    connections: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    list_after: float = 0.0  # monotonic: no listing before, after a failed one
    state: str = "not started"
    error: str | None = None
    since_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    def lock(self) -> asyncio.Lock:
        """The lock serialising (re)connects on the running loop."""
        loop = asyncio.get_running_loop()
        found = self.locks.get(loop)
        if found is None:
            found = self.locks[loop] = asyncio.Lock()
        return found

    def mark_stale(self) -> None:
        """The server said its tools changed: list them again before the next turn."""
        self.stale = True

    def up(self) -> None:
        self._set("connected", None)

    def down(self, error: str) -> None:
        self._set("unreachable", error)

    def _set(self, state: str, error: str | None) -> None:
        if (state, error) != (self.state, self.error):
            self.state, self.error = state, error
            self.since_ms = int(time.time() * 1000)


_states: weakref.WeakKeyDictionary[MCPServer, ServerState] = weakref.WeakKeyDictionary()


_EXIT_CLOSE_S = 5.0
_exit_hook_armed = False


def remember(server: MCPServer, connection: Any) -> None:
    """Keep ``connection`` as the running loop's session with ``server``; at interpreter
    exit open sessions are closed while their loops still run (atexit runs this hook
    before the one that stops the loop sync APIs share, registered earlier)."""
    global _exit_hook_armed
    state_of(server).connections[asyncio.get_running_loop()] = connection
    if not _exit_hook_armed:
        _exit_hook_armed = True
        atexit.register(_close_at_exit)


def _close_at_exit() -> None:
    for state in list(_states.values()):
        if state.pid != os.getpid():
            continue
        for loop, connection in list(state.connections.items()):
            if not loop.is_running() or loop.is_closed():
                continue
            future = asyncio.run_coroutine_threadsafe(connection.close(), loop)
            with contextlib.suppress(Exception):
                future.result(_EXIT_CLOSE_S)


def state_of(server: MCPServer) -> ServerState:
    found = _states.get(server)
    if found is None or found.pid != os.getpid():
        found = _states[server] = ServerState(pid=os.getpid())
    return found


def health(servers: list[MCPServer]) -> dict[str, dict[str, Any]]:
    """Per server name: ``state`` (``"connected"``, ``"unreachable"`` or ``"not started"``:
    no turn needed it yet), the last ``error``, how many ``tools`` it lists and since
    when (``since_ms``) it is in that state."""
    report: dict[str, dict[str, Any]] = {}
    for server in servers:
        s = state_of(server)
        report[server.name] = {
            "state": s.state,
            "error": s.error,
            "tools": None if s.tools is None else len(s.tools),
            "since_ms": s.since_ms,
        }
    return report


async def close_all(servers: list[MCPServer]) -> None:
    """Close this loop's sessions with ``servers`` (stdio servers are stopped)."""
    loop = asyncio.get_running_loop()
    for server in servers:
        connection = state_of(server).connections.pop(loop, None)
        if connection is not None:
            await connection.close()

"""One live MCP session, owned by one long-lived task on the event loop that uses it.

The SDK's transports and ``ClientSession`` are async context managers holding task
groups, which must be entered and left by the same task; so each connection runs in a
task of its own (:meth:`Connection._serve`), and calls from any task of that loop go
through the session it published. Between the transport and the session sits a relay:
when the transport's read side ends (the stdio server died, the HTTP stream broke) the
relay marks the connection dead and closes it, and the next call opens a new one (a
dead stdio server is started again, an HTTP session reconnected).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TextIO

import anyio
import mcp.types as mt
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from convoq.mcp._dies_with_parent import wrap as dies_with_parent
from convoq.mcp._guard import GUARD, RefusedAddressError, guarded_client
from convoq.mcp.config import HTTPSpec, MCPServer, StdioSpec

log = logging.getLogger("convoq.mcp")

Streams = tuple[Any, Any]
_CLOSE_TIMEOUT_S = 3.0


class Connection:
    """A session with ``server`` on the running loop; ``on_change`` is called when the
    server announces that its tool list changed."""

    def __init__(self, server: MCPServer, on_change: Callable[[], None]) -> None:
        self.server = server
        self._on_change = on_change
        self._session: ClientSession | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._failure: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def session(self) -> ClientSession | None:
        return self._session

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done() and not self._stop.is_set()

    async def open(self) -> ClientSession:
        """Start the connection's task and wait for the handshake (bounded)."""
        self._task = asyncio.create_task(self._serve(), name=f"convoq-mcp-{self.server.name}")
        try:
            await asyncio.wait_for(self._ready.wait(), self.server.common.connect_timeout_s)
        except TimeoutError:
            await self.close()
            raise ConnectionError(
                f"no MCP handshake within {self.server.common.connect_timeout_s}s"
            ) from None
        if self._session is None:
            failure = self._failure
            raise ConnectionError(describe(failure)) from failure
        return self._session

    async def close(self) -> None:
        """End the session (the SDK stops a stdio server: stdin closed, then signals)."""
        self._stop.set()
        task = self._task
        if task is None or task.done():
            return
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), _CLOSE_TIMEOUT_S)
        if not task.done():
            task.cancel()

    async def _serve(self) -> None:
        try:
            async with self._transport() as (read, write):
                relay_in, relay_out = anyio.create_memory_object_stream[SessionMessage | Exception](
                    0
                )
                async with anyio.create_task_group() as group:
                    group.start_soon(self._relay, read, relay_in)
                    async with ClientSession(
                        relay_out, write, message_handler=self._on_message
                    ) as session:
                        await session.initialize()
                        self._session = session
                        self._ready.set()
                        await self._stop.wait()
                    group.cancel_scope.cancel()
        except Exception as exc:  # reported to the caller of open, or by the next call
            self._failure = exc
            log.warning("MCP server %r: connection ended: %s", self.server.name, describe(exc))
        finally:
            self._session = None
            self._stop.set()
            self._ready.set()

    async def _relay(self, read: Any, relay_in: Any) -> None:
        """Pass messages on; when the transport's read side ends, end the connection."""
        async with relay_in:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                async for item in read:
                    await relay_in.send(item)
        self._stop.set()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mt.ToolListChangedNotification):
            self._on_change()

    def _transport(self) -> AbstractAsyncContextManager[Streams]:
        spec = self.server.transport
        if isinstance(spec, StdioSpec):
            # The server dies with this process, even killed with -9 (see the module);
            # the guard execs the command, so a missing one is told here, not by it.
            command, args = dies_with_parent(_found(spec), list(spec.args))
            params = StdioServerParameters(
                command=command, args=args, env=dict(spec.env), cwd=spec.cwd
            )
            # Celery replaces sys.stderr with a logging proxy that has no file descriptor;
            # the child needs a real one for its stderr.
            return stdio_client(params, errlog=_real_stderr())
        return _http(self.server.name, spec)


def _found(spec: StdioSpec) -> str:
    """The command's path, found as the child would find it; FileNotFoundError if none."""
    path = spec.env.get("PATH", os.environ.get("PATH", os.defpath))
    found = shutil.which(spec.command, path=path)
    if found is None:
        raise FileNotFoundError(f"command {spec.command!r} not found or not executable")
    return found


@contextlib.asynccontextmanager
async def _http(name: str, spec: HTTPSpec) -> AsyncIterator[Streams]:
    await GUARD.ensure()  # nothing is sent unless the guard is in force
    async with (
        guarded_client(name, spec.headers, spec.allowed_networks) as client,
        streamable_http_client(spec.url, http_client=client) as streams,
    ):
        yield streams[0], streams[1]


def _real_stderr() -> TextIO:
    for candidate in (sys.stderr, sys.__stderr__):
        try:
            if candidate is not None:
                candidate.fileno()
                return candidate
        except (AttributeError, OSError, ValueError):
            continue
    # The child keeps it for as long as it lives.
    return open(os.devnull, "w")


def describe(exc: BaseException | None) -> str:
    """One line for an error from the SDK or a transport (task groups wrap them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if exc is None:
        return "the connection closed"
    if isinstance(exc, MCPError):
        return exc.message
    if isinstance(exc, ConnectionError | RefusedAddressError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

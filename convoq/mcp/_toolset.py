"""An MCP server's tools as convoq tools, and their calls through this process's session.

A call carries the :class:`~convoq.context.RunContext` idempotency key in the request's
``_meta`` (:data:`IDEMPOTENCY_META_KEY`): a call rerun after its worker died sends the
same key, so a server that dedupes on it performs the effect once. A server that cannot
be reached, or drops the connection mid-call, fails that call with a tool error the model
reads; the turn goes on, and the next call reconnects.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import jsonschema  # type: ignore[import-untyped, unused-ignore]  # stubs may be absent
import mcp.types as mt
import referencing.exceptions
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from convoq.context import RunContext
from convoq.errors import ToolError
from convoq.mcp._connection import Connection, describe
from convoq.mcp._results import tool_output
from convoq.mcp._state import remember, state_of
from convoq.mcp.config import IDEMPOTENCY_META_KEY, HTTPSpec, MCPServer
from convoq.models.base import ToolSpec
from convoq.observe import tracing
from convoq.tools import Tool, ToolOutput

log = logging.getLogger("convoq.mcp")

# What Chat Completions (and most model APIs) accept as a function name.
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_MAX_PAGES = 100

LIST_RETRY_S = 10.0
"""After a server could not list its tools, turns within this long offer its last list
(or none) instead of trying again; a call of one of its tools still tries."""


class MCPTool(Tool):
    """A tool an MCP server listed, offered under the server's prefix."""

    def __init__(self, server: MCPServer, remote: mt.Tool) -> None:
        # Not Tool.__init__: there is no Python function to read a schema from.
        self.fn = self._not_local
        self.server = server
        self.remote_name = remote.name
        self.name = server.common.tool_name(remote.name)
        self.description = (remote.description or remote.title or "").strip()
        self.schema = dict(remote.input_schema or {"type": "object", "properties": {}})
        approval = server.common.approval
        self.requires_approval = (
            remote.name in approval if isinstance(approval, frozenset) else approval
        )
        self.takes_context = True

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.schema)

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """``arguments`` checked against the input schema the server listed, before anyone
        is asked to approve the call and before the server is called (it checks again). A
        schema this process cannot apply (invalid, or referring elsewhere) leaves the
        check to the server."""
        if not isinstance(arguments, dict):
            raise ToolError(f"arguments for tool {self.name!r} must be a JSON object")
        problems = _schema_problems(self.schema, arguments)
        if problems:
            raise ToolError(f"invalid arguments for tool {self.name!r}: {problems}")
        return dict(arguments)

    async def call(self, arguments: dict[str, Any], ctx: RunContext[Any] | None = None) -> str:
        return (await self.output(arguments, ctx)).text

    async def output(
        self, arguments: dict[str, Any], ctx: RunContext[Any] | None = None
    ) -> ToolOutput:
        meta = None
        if ctx is not None and ctx.tool_call_id is not None:
            meta = {IDEMPOTENCY_META_KEY: ctx.idempotency_key}
        return await call_tool(self.server, self.remote_name, self.validate(arguments), meta)

    def _not_local(self, *args: Any, **kwargs: Any) -> Any:
        raise ToolError(f"{self.name!r} runs on MCP server {self.server.name!r}: call it in a turn")


class _Unreachable(MCPTool):
    """Stands in for a name with the server's prefix that is not listed now. It never
    calls the server (whether such a call needs approval cannot be known); it tells the
    model why: the server cannot be reached, or it lists no such tool."""

    def __init__(self, server: MCPServer, name: str) -> None:
        remote = mt.Tool(
            name=name[len(server.common.prefix) :] or name, input_schema={"type": "object"}
        )
        super().__init__(server, remote)
        self.requires_approval = False

    async def output(
        self, arguments: dict[str, Any], ctx: RunContext[Any] | None = None
    ) -> ToolOutput:
        state = state_of(self.server)
        if state.tools is None:
            await _session(self.server)  # raises the reason it cannot be reached
        raise ToolError(f"MCP server {self.server.name!r} lists no tool {self.remote_name!r}")


def _schema_problems(schema: dict[str, Any], arguments: dict[str, Any]) -> str:
    """What in ``arguments`` does not fit ``schema`` ('' when all fits, or when the schema
    cannot be applied here: then the server is the judge)."""
    try:
        validator = jsonschema.validators.validator_for(schema)
        validator.check_schema(schema)
        errors = list(validator(schema).iter_errors(arguments))
    except (jsonschema.SchemaError, referencing.exceptions.Unresolvable):
        return ""
    return "; ".join(
        f"{'.'.join(str(p) for p in e.absolute_path) or 'arguments'}: {e.message}"
        for e in sorted(errors, key=lambda e: [str(p) for p in e.absolute_path])
    )


def missing_tool(server: MCPServer, name: str) -> Tool:
    return _Unreachable(server, name)


async def current_tools(server: MCPServer) -> list[Tool]:
    """The server's tools, listed again only when none are known or the server announced
    a change; while it cannot be reached, the last list (or none)."""
    state = state_of(server)
    if state.tools is not None and not state.stale:
        return list(state.tools)
    if time.monotonic() < state.list_after:
        # It failed a moment ago: turns in between do not each wait for it again.
        return list(state.tools or [])
    try:
        session = await _session(server)
        listed = await asyncio.wait_for(_list_all(session), server.common.connect_timeout_s)
    except (ToolError, TimeoutError, MCPError) as exc:
        state.down(str(exc) or "listing its tools timed out")
        state.list_after = time.monotonic() + LIST_RETRY_S
        log.warning("MCP server %r: tools not listed (%s)", server.name, state.error)
        return list(state.tools or [])
    state.stale = False
    state.tools = _as_tools(server, listed)
    return list(state.tools)


def _as_tools(server: MCPServer, listed: list[mt.Tool]) -> list[Tool]:
    tools: list[Tool] = []
    for remote in listed:
        name = server.common.tool_name(remote.name)
        if not _TOOL_NAME.match(name):
            log.warning(
                "MCP server %r: tool %r left out (name not usable by models)", server.name, name
            )
            continue
        tools.append(MCPTool(server, remote))
    return tools


async def _list_all(session: ClientSession) -> list[mt.Tool]:
    tools: list[mt.Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        params = mt.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


async def _session(server: MCPServer) -> ClientSession:
    """This loop's session with ``server``, opened (again) when there is none alive."""
    state = state_of(server)
    loop = asyncio.get_running_loop()
    async with state.lock():
        connection: Connection | None = state.connections.get(loop)
        if connection is not None and connection.alive and connection.session is not None:
            return connection.session
        if connection is not None:
            await connection.close()
        connection = Connection(server, state.mark_stale)
        try:
            session = await connection.open()
        except Exception as exc:
            state.down(describe(exc))
            raise ToolError(
                f"MCP server {server.name!r} cannot be reached ({describe(exc)}); the call"
                " did not run"
            ) from None
        remember(server, connection)
        state.mark_stale()  # a new session may list other tools than the last one did
        state.up()
        return session


async def call_tool(
    server: MCPServer, remote: str, arguments: dict[str, Any], meta: dict[str, Any] | None
) -> ToolOutput:
    """Call ``remote`` on ``server``; ToolError when the call could not be made or ended.

    An HTTP server that no longer knows the session (restarted: it refuses the request as
    invalid, so nothing ran) gets the call again on a new session, once."""
    for attempt in (1, 2):
        session = await _session(server)
        try:
            with tracing.span(
                "convoq.mcp.call", {"convoq.mcp.server": server.name, "convoq.mcp.tool": remote}
            ):
                result = await session.call_tool(
                    remote,
                    arguments,
                    read_timeout_seconds=server.common.call_timeout_s,
                    meta=meta,  # type: ignore[arg-type]
                )
        except MCPError as exc:
            if exc.code == mt.INVALID_REQUEST and _is_http(server) and attempt == 1:
                await _lost(server, exc)
                continue
            raise await _call_error(server, exc) from None
        except Exception as exc:  # transport failures: reconnect next time
            await _lost(server, exc)
            raise ToolError(
                f"MCP server {server.name!r}: the call failed ({describe(exc)}); it may or"
                " may not have run"
            ) from None
        return tool_output(result)
    raise AssertionError("unreachable")  # the loop returns or raises


def _is_http(server: MCPServer) -> bool:
    return isinstance(server.transport, HTTPSpec)


async def _call_error(server: MCPServer, exc: MCPError) -> ToolError:
    name = server.name
    if exc.code == mt.CONNECTION_CLOSED:
        await _lost(server, exc)
        return ToolError(
            f"MCP server {name!r} closed the connection during the call (it may or may not"
            " have run); it is reconnected at the next call"
        )
    if exc.code == mt.REQUEST_TIMEOUT:
        return ToolError(
            f"MCP server {name!r} did not answer within {server.common.call_timeout_s}s"
        )
    return ToolError(f"MCP server {name!r} refused the call: {exc.message}")


async def _lost(server: MCPServer, exc: BaseException) -> None:
    state = state_of(server)
    state.down(describe(exc))
    connection = state.connections.pop(asyncio.get_running_loop(), None)
    if connection is not None:
        await connection.close()

"""An MCP server for the tests (the SDK's MCPServer, formerly FastMCP), served over stdio
(``python -m tests.support.mcp_server``) or streamable HTTP (``--http PORT``).

It records what it saw in ``MCP_TEST_LOG`` (one JSON line per call: the tool, its
arguments, the request's ``_meta`` and the server's pid), so tests check from outside
what reached the server.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent

# A 1x1 PNG: what the image tool returns.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


class _ListingLogged(MCPServer):
    """Logs each tools/list too, so tests see how often a client lists."""

    async def list_tools(self) -> Any:
        path = os.environ.get("MCP_TEST_LOG")
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"tool": "(list)", "pid": os.getpid()}) + "\n")
        return await super().list_tools()


server = _ListingLogged("convoq-test")


def _log(tool: str, ctx: Context, **arguments: Any) -> None:
    path = os.environ.get("MCP_TEST_LOG")
    if not path:
        return
    meta = ctx.request_context.meta or {}
    headers = ctx.headers or {}
    entry = {
        "tool": tool,
        "arguments": arguments,
        "meta": dict(meta),
        "pid": os.getpid(),
        "authorization": headers.get("authorization"),
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


@server.tool()
def add(a: int, b: int, ctx: Context) -> int:
    """Add two numbers."""
    _log("add", ctx, a=a, b=b)
    return a + b


@server.tool(name="dotted.name")
def dotted() -> str:
    """A name models do not accept for a function."""
    return "never offered"


@server.tool()
def pixel(ctx: Context) -> list[TextContent | ImageContent]:
    """A tiny picture, with a caption."""
    _log("pixel", ctx)
    data = base64.b64encode(PIXEL).decode()
    return [
        TextContent(type="text", text="one pixel"),
        ImageContent(type="image", data=data, mimeType="image/png"),
    ]


@server.tool()
def fail(ctx: Context) -> str:
    """Always fails."""
    _log("fail", ctx)
    raise ToolError("the test tool failed on purpose")


@server.tool()
def slow(seconds: float, ctx: Context) -> str:
    """Sleep, then answer (a call a test can interrupt)."""
    _log("slow", ctx, seconds=seconds)
    time.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def die(ctx: Context) -> str:
    """Exit the server process mid-call (a crash)."""
    _log("die", ctx)
    os._exit(3)


@server.tool()
async def grow(ctx: Context) -> str:
    """Add a tool named ``extra`` and announce the change (tools/list_changed)."""
    _log("grow", ctx)

    def extra() -> str:
        """A tool that appeared later."""
        return "extra here"

    server.add_tool(extra, name="extra")
    await ctx.session.send_tool_list_changed()
    return "grown"


def main(argv: list[str]) -> None:
    if len(argv) >= 2 and argv[0] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(argv[1]))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])

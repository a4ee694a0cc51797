"""Worker profiles with MCP servers (CONVOQ_AGENTS=tests.support.mcp_agents).

``mcp`` takes tools from the test server (stdio, ``t__*``; over HTTP, ``h__*``, at
``MCP_TEST_HTTP_URL`` with the bearer token ``MCP_TEST_TOKEN`` when they are set), from
mcp-server-time (``time__*``, ``convert_time`` needing approval) and from ``gone``, a
command that does not exist. Its model reads the user's message: ``add A B``,
``hadd A B``, ``gone``, ``pixel``, ``slow SECONDS`` or ``convert HH:MM ZONE``, asks for
that call, then answers ``tool said: <result>``. The test server logs each call to
:func:`log_path`, and the model logs which process asked for a call, so tests see from
outside who did what.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from convoq import Agent, Message, ToolCall
from convoq.mcp import http_server, stdio_server
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel
from tests.support.mcp_servers import stdio_args


def log_path(prefix: str) -> Path:
    """Where the test server of workers with ``prefix`` logs its calls."""
    return Path(tempfile.gettempdir()) / f"convoq-mcp-{prefix}.log"


def asked_path(prefix: str) -> Path:
    """Where the model logs the pid of each process that asked for a call."""
    return Path(tempfile.gettempdir()) / f"convoq-mcp-{prefix}.asked"


_PREFIX = os.environ.get("CONVOQ_PREFIX", "convoq")


def _call_for(text: str) -> ToolCall:
    word, *rest = text.split()
    if word == "add":
        return ToolCall(id="c-add", name="t__add", arguments={"a": int(rest[0]), "b": int(rest[1])})
    if word == "hadd":
        return ToolCall(
            id="c-hadd", name="h__add", arguments={"a": int(rest[0]), "b": int(rest[1])}
        )
    if word == "gone":
        return ToolCall(id="c-gone", name="gone__ping", arguments={})
    if word == "pixel":
        return ToolCall(id="c-pixel", name="t__pixel", arguments={})
    if word == "slow":
        return ToolCall(id="c-slow", name="t__slow", arguments={"seconds": float(rest[0])})
    arguments = {"source_timezone": "UTC", "time": rest[0], "target_timezone": rest[1]}
    return ToolCall(id="c-time", name="time__convert_time", arguments=arguments)


def _model(request: ModelRequest) -> str | Message:
    last = request.messages[-1]
    if last.role == MessageRole.TOOL:
        return f"tool said: {last.text}"
    with asked_path(_PREFIX).open("a") as f:
        f.write(f"{os.getpid()}\n")
    return Message(role=MessageRole.ASSISTANT, tool_calls=[_call_for(last.text)])


_over_http = (
    [
        http_server(
            "h",
            os.environ["MCP_TEST_HTTP_URL"],
            headers={"Authorization": f"Bearer {os.environ['MCP_TEST_TOKEN']}"},
            allowed_networks="127.0.0.1",
        )
    ]
    if os.environ.get("MCP_TEST_HTTP_URL")
    else []
)

mcp_agent = Agent(
    ScriptedModel(_model),
    name="mcp",
    mcp_servers=[
        *_over_http,
        stdio_server("t", **stdio_args(log_path(_PREFIX))),
        stdio_server(
            "time",
            sys.executable,
            ["-m", "mcp_server_time", "--local-timezone", "UTC"],
            requires_approval=["convert_time"],
        ),
        stdio_server("gone", str(Path(tempfile.gettempdir()) / "no-such-mcp-server")),
    ],
)

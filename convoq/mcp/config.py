"""How an MCP server is reached, as configuration: a command (stdio) or a URL (streamable
HTTP). Nothing here imports the MCP SDK; building a server object starts nothing.

A stdio command comes only from here, that is from the code that builds an Agent or a
worker profile: nothing a turn carries can name a command or a URL. The model only picks
among the tools these servers listed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from convoq.approvals import ApprovalRule, check_rule
from convoq.errors import ConfigurationError
from convoq.settings import ConvoqSettings
from convoq.tools import Tool

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")

DEFAULT_CONNECT_TIMEOUT_S = 15.0
"""Starting a server (or reaching it) and its MCP handshake, at most."""
DEFAULT_CALL_TIMEOUT_S = 300.0
"""One tool call, at most; past it the model is told the call timed out."""

IDEMPOTENCY_META_KEY = "idempotency_key"
"""The key of a tool call's MCP request ``_meta`` that carries ``ctx.idempotency_key``."""

Approval = ApprovalRule | Iterable[str]
"""Which calls wait for a human: True/False, a function ``(ctx, arguments) -> bool``, or
the names of the server's tools (unprefixed) that always do."""


@dataclass(frozen=True)
class _Common:
    name: str
    prefix: str
    approval: ApprovalRule | frozenset[str]
    connect_timeout_s: float
    call_timeout_s: float

    def tool_name(self, remote: str) -> str:
        """The name the model sees for the server's tool ``remote``."""
        return f"{self.prefix}{remote}"


def require_sdk() -> None:
    """ConfigurationError naming the extra when the MCP SDK is not installed."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ConfigurationError(
            "MCP servers need the MCP SDK: pip install 'convoq[mcp]'"
        ) from None


def _common(
    name: str,
    prefix: str | None,
    requires_approval: Approval,
    connect_timeout_s: float,
    call_timeout_s: float,
) -> _Common:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigurationError(
            f"an MCP server name is 1-32 letters, digits, '_' or '-' (it prefixes its tool"
            f" names), not {name!r}"
        )
    prefix = f"{name}__" if prefix is None else prefix
    if not isinstance(prefix, str) or (prefix and not re.match(r"^[A-Za-z0-9_-]{1,33}$", prefix)):
        raise ConfigurationError(
            f"MCP server {name!r}: tool_prefix is letters, digits, '_' or '-', not {prefix!r}"
        )
    if not connect_timeout_s > 0 or not call_timeout_s > 0:
        raise ConfigurationError(f"MCP server {name!r}: timeouts must be > 0 seconds")
    require_sdk()
    approval: ApprovalRule | frozenset[str]
    if isinstance(requires_approval, bool) or callable(requires_approval):
        approval = check_rule(requires_approval, f"MCP server {name!r}")
    elif isinstance(requires_approval, str):
        raise ConfigurationError(
            f"MCP server {name!r}: requires_approval takes a list of tool names, not one str"
        )
    else:
        approval = frozenset(requires_approval)
        if not all(isinstance(n, str) for n in approval):
            raise ConfigurationError(f"MCP server {name!r}: requires_approval names must be str")
    return _Common(name, prefix, approval, connect_timeout_s, call_timeout_s)


@dataclass(frozen=True)
class StdioSpec:
    """What starts a stdio server (the process's environment is the SDK's safe default
    set plus ``env``)."""

    command: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None


@dataclass(frozen=True)
class HTTPSpec:
    """Where a streamable HTTP server answers, and what every request carries."""

    url: str
    headers: Mapping[str, str]
    allowed_networks: str | None


@dataclass(eq=False)
class MCPServer:
    """One MCP server an Agent (or worker profile) takes tools from. Build it with
    :func:`stdio_server` or :func:`http_server`."""

    common: _Common
    transport: StdioSpec | HTTPSpec

    @property
    def name(self) -> str:
        return self.common.name

    async def toolset_tools(self) -> list[Tool]:
        """The server's tools as convoq tools (listed once per process, again after the
        server announced a change); [] while it cannot be reached."""
        from convoq.mcp._toolset import current_tools  # the MCP SDK, only when used

        return await current_tools(self)

    def stand_in(self, name: str) -> Tool | None:
        """For a tool name with this server's prefix that is not listed now (the server
        is down, or the tool went away): a tool whose call tells the model so."""
        if not name.startswith(self.common.prefix):
            return None
        from convoq.mcp._toolset import missing_tool

        return missing_tool(self, name)


def stdio_server(
    name: str,
    command: str,
    args: Iterable[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    tool_prefix: str | None = None,
    requires_approval: Approval = False,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
) -> MCPServer:
    """An MCP server run as a child process speaking MCP on its stdin/stdout.

    Args:
        name: names the server in health reports and, with ``__``, prefixes its tools
            (``time__get_current_time``).
        command: the program, e.g. ``sys.executable`` or ``"uvx"``.
        args: its arguments.
        env: variables set for it, over the MCP SDK's small default set (a server does
            not inherit the worker's whole environment).
        cwd: its working directory.
        tool_prefix: instead of ``name + "__"`` ("" offers the tools unprefixed).
        requires_approval: True, False, a function ``(ctx, arguments) -> bool``, or the
            names of this server's tools that wait for a human.
        connect_timeout_s: starting the server and its handshake, at most.
        call_timeout_s: one tool call, at most.
    """
    common = _common(name, tool_prefix, requires_approval, connect_timeout_s, call_timeout_s)
    if not isinstance(command, str) or not command:
        raise ConfigurationError(f"MCP server {name!r}: command must be a non-empty str")
    arguments = tuple(args)
    if not all(isinstance(a, str) for a in arguments):
        raise ConfigurationError(f"MCP server {name!r}: args must be strings")
    environment = dict(env or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in environment.items()):
        raise ConfigurationError(f"MCP server {name!r}: env maps str to str")
    spec = StdioSpec(command, arguments, environment, None if cwd is None else os.fspath(cwd))
    return MCPServer(common, spec)


def http_server(
    name: str,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    allowed_networks: str | Iterable[str] | None = None,
    tool_prefix: str | None = None,
    requires_approval: Approval = False,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
) -> MCPServer:
    """An MCP server reached over streamable HTTP.

    Args:
        name: as for :func:`stdio_server`.
        url: the server's MCP endpoint (``http://`` or ``https://``).
        headers: sent with every request, e.g. ``{"Authorization": f"Bearer {token}"}``.
        allowed_networks: networks the URL may reach although not public (comma
            separated or a list; e.g. ``"10.0.0.0/8,127.0.0.1"``). Unset:
            ``CONVOQ_MCP_ALLOWED_NETWORKS``; unset too: public addresses only, checked
            against the address each connection is made to (the callback guard,
            :mod:`convoq.netguard`).
        tool_prefix: as for :func:`stdio_server`.
        requires_approval: as for :func:`stdio_server`.
        connect_timeout_s: as for :func:`stdio_server`.
        call_timeout_s: as for :func:`stdio_server`.
    """
    common = _common(name, tool_prefix, requires_approval, connect_timeout_s, call_timeout_s)
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"MCP server {name!r}: url must be an http(s) URL with a host, not {url!r}"
        )
    given = dict(headers or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in given.items()):
        raise ConfigurationError(f"MCP server {name!r}: headers map str to str")
    networks = allowed_networks
    if networks is not None and not isinstance(networks, str):
        networks = ",".join(networks)
    networks = ConvoqSettings.resolve(mcp_allowed_networks=networks).mcp_allowed_networks
    _check_networks(name, networks)
    return MCPServer(common, HTTPSpec(url, given, networks))


def _check_networks(name: str, networks: str | None) -> None:
    from convoq.netguard import parse_networks

    try:
        parse_networks(networks)
    except ConfigurationError as exc:
        raise ConfigurationError(f"MCP server {name!r}: {exc}") from None


def check_servers(servers: Iterable[MCPServer]) -> list[MCPServer]:
    """``servers`` as a list, each an :class:`MCPServer`, no two with one name."""
    if isinstance(servers, MCPServer):
        servers = [servers]
    found: list[MCPServer] = []
    for server in servers:
        if not isinstance(server, MCPServer):
            raise ConfigurationError(
                "mcp_servers takes servers built by convoq.mcp.stdio_server(...) or"
                f" convoq.mcp.http_server(...), not {type(server).__name__}"
            )
        if any(s.name == server.name for s in found):
            raise ConfigurationError(f"two MCP servers are named {server.name!r}")
        found.append(server)
    return found

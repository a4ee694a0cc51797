"""Tools from MCP servers (the official MCP Python SDK, ``pip install 'convoq[mcp]'``).

An Agent or worker profile lists its servers (``Agent(..., mcp_servers=[...])``) built by
:func:`stdio_server` (a command) or :func:`http_server` (a streamable HTTP URL). Their
tools are offered to the model beside the Python tools, named ``<server>__<tool>``, and
called through the same engine path: journaled, counted, traced, with the approval rule
and with the call's idempotency key in the MCP request's ``_meta``
(``{"idempotency_key": ...}``).

Each process opens its sessions when a turn first needs them and keeps them: one
long-lived task per session on the event loop that uses it (a worker's loop, or the one
sync APIs share). Tool lists are cached per process and listed again after a server
announces ``notifications/tools/list_changed``. The MCP SDK is imported only once a
server is configured.
"""

from convoq.mcp._state import close_all, health
from convoq.mcp.config import IDEMPOTENCY_META_KEY, MCPServer, http_server, stdio_server

__all__ = [
    "IDEMPOTENCY_META_KEY",
    "MCPServer",
    "close_all",
    "health",
    "http_server",
    "stdio_server",
]

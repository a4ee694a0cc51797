"""The address guard for streamable HTTP MCP servers: the callback guard
(:mod:`convoq.netguard`) applied to every connection the MCP SDK's HTTP client opens.

The MCP SDK speaks HTTP through httpx2/httpcore2, not httpx/httpcore, so the guarded
network backend here is httpcore2's; which addresses pass is decided by the same
:class:`~convoq.netguard.CallbackPolicy`, over ``CONVOQ_MCP_ALLOWED_NETWORKS`` (or the
server's ``allowed_networks``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import httpcore2
import httpx2

from convoq.netguard import CallbackPolicy, IPAddress, connect_checked, resolve

# The SDK's own defaults: connect/write 30 s; reads wait long, a server may hold a stream.
_TIMEOUT = httpx2.Timeout(30.0, read=300.0)


class RefusedAddressError(httpcore2.ConnectError):
    """The MCP URL leads to an address the guard refuses."""


class _GuardedBackend(httpcore2.AsyncNetworkBackend):
    """Connects as the callbacks' guard does (:func:`~convoq.netguard.connect_checked`):
    the host resolved here, every address checked, the connection made to the checked
    address, and the socket's peer checked too."""

    def __init__(self, policy: CallbackPolicy, server: str) -> None:
        self._policy = policy
        self._server = server
        self._inner = httpcore2.AnyIOBackend()

    def _check(self, address: IPAddress, host: str) -> None:
        kind = self._policy.refusal(address)
        if kind is not None:
            raise RefusedAddressError(
                f"MCP server {self._server!r} is at {host} ({address}), a {kind} address:"
                " MCP URLs may only reach public addresses unless CONVOQ_MCP_ALLOWED_NETWORKS"
                " (or the server's allowed_networks) allows it"
            )

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        return await connect_checked(
            host,
            port,
            resolver=resolve,
            check=self._check,
            connect=lambda address: self._inner.connect_tcp(
                address, port, timeout, local_address, socket_options
            ),
            connect_error=httpcore2.ConnectError,
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise RefusedAddressError("MCP servers are not reached over a unix socket")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def guarded_client(
    server: str, headers: Mapping[str, str], allowed_networks: str | None
) -> httpx2.AsyncClient:
    """An httpx2 client for the MCP SDK that connects only where the guard allows."""
    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    # httpx2 takes no network backend: its transport hands every request to this pool,
    # rebuilt around the guarded backend (TLS as httpx2's default: certificates checked
    # against the URL's host name). tests/mcp/test_mcp.py pins that the guard is used.
    transport._pool = httpcore2.AsyncConnectionPool(
        ssl_context=httpx2.create_ssl_context(trust_env=False),
        network_backend=_GuardedBackend(CallbackPolicy(allowed_networks), server),
    )
    return httpx2.AsyncClient(headers=dict(headers), timeout=_TIMEOUT, transport=transport)

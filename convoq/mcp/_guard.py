"""The address guard for streamable HTTP MCP servers: the callback guard
(:mod:`convoq.netguard`) applied to every connection the MCP SDK's HTTP client opens.

The MCP SDK speaks HTTP through httpx2/httpcore2, not httpx/httpcore, so the guarded
network backend here is httpcore2's; which addresses pass is decided by the same
:class:`~convoq.netguard.CallbackPolicy`, over ``CONVOQ_MCP_ALLOWED_NETWORKS`` (or the
server's ``allowed_networks``). The SDK takes the HTTP client as its public
``http_client=`` argument; that client's transport is :class:`GuardedTransport`, httpx2's
custom-transport interface over httpcore2's pool with the guarded network backend, and
:data:`GUARD` checks once per process that requests so built reach that backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import httpcore2
import httpx2

from convoq.netguard import (
    PROBE_URL,
    CallbackPolicy,
    GuardCheck,
    GuardedConnections,
    IPAddress,
    PoolTransport,
    ProbeBackend,
)

# The SDK's own defaults: connect/write 30 s; reads wait long, a server may hold a stream.
_TIMEOUT = httpx2.Timeout(30.0, read=300.0)


class RefusedAddressError(httpcore2.ConnectError):
    """The MCP URL leads to an address the guard refuses."""


class _GuardedBackend(GuardedConnections, httpcore2.AsyncNetworkBackend, core=httpcore2):
    """Connects as the callbacks' guard does (:class:`~convoq.netguard.GuardedConnections`):
    the host resolved here, every address checked, the connection made to the checked
    address, and the socket's peer checked too."""

    def __init__(self, policy: CallbackPolicy, server: str) -> None:
        super().__init__()
        self._policy = policy
        self._server = server

    def check(self, address: IPAddress, host: str) -> None:
        kind = self._policy.refusal(address)
        if kind is not None:
            raise RefusedAddressError(
                f"MCP server {self._server!r} is at {host} ({address}), a {kind} address:"
                " MCP URLs may only reach public addresses unless CONVOQ_MCP_ALLOWED_NETWORKS"
                " (or the server's allowed_networks) allows it"
            )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        raise RefusedAddressError("MCP servers are not reached over a unix socket")


def guarded_client(
    server: str, headers: Mapping[str, str], allowed_networks: str | None
) -> httpx2.AsyncClient:
    """An httpx2 client for the MCP SDK (its ``http_client=``) that connects only where the
    guard allows. Await :data:`GUARD`'s ``ensure()`` before its first use in a process."""
    backend = _GuardedBackend(CallbackPolicy(allowed_networks), server)
    transport = _transport_over(backend)
    return httpx2.AsyncClient(headers=dict(headers), timeout=_TIMEOUT, transport=transport)


class GuardedTransport(PoolTransport, httpx2.AsyncBaseTransport, client=httpx2, core=httpcore2):
    """An httpx2 transport (its custom-transport interface) over httpcore2's connection
    pool built on ``backend``: see :class:`convoq.netguard.PoolTransport`."""


# How MCP transports are built (the guard check probes this very function).
_transport_over: Callable[[httpcore2.AsyncNetworkBackend], httpx2.AsyncBaseTransport] = (
    GuardedTransport
)


class _ProbeBackend(ProbeBackend, httpcore2.AsyncNetworkBackend):
    """Raises ProbeReached when asked to connect (see :class:`~convoq.netguard.GuardCheck`)."""


async def _probe() -> None:
    async with httpx2.AsyncClient(transport=_transport_over(_ProbeBackend())) as client:
        await client.get(PROBE_URL)


GUARD = GuardCheck("MCP servers over HTTP", _probe)
"""Checked before a process's first MCP connection over HTTP: a transport that does not
route through the guarded backend connects nowhere."""

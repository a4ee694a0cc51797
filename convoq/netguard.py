"""Callback URLs that cannot be turned against the network they are sent from.

A ``callback_url`` makes a worker POST wherever the submitter says. Once less-trusted
callers can submit (the HTTP gateway), that is a way to reach internal services, so by
default a callback may only go to a *public* address. Refused, for IPv4 and IPv6 alike (an IPv6
address that carries an IPv4 one -- IPv4-mapped ``::ffff:0:0/96``, 6to4 ``2002::/16``,
NAT64 ``64:ff9b::/96``, Teredo ``2001::/32`` -- is judged as the IPv4 address its packets
end up at)::

    unspecified   0.0.0.0, ::
    loopback      127.0.0.0/8, ::1
    link-local    169.254.0.0/16, fe80::/10 (cloud metadata services live here)
    multicast     224.0.0.0/4, ff00::/8
    private       10/8, 172.16/12, 192.168/16, fc00::/7, ...
    reserved      240.0.0.0/4, ::/8, ...
    non-public    anything else not globally routable (100.64.0.0/10, 192.0.2.0/24, ...)

The check runs twice: when the turn is submitted (:meth:`CallbackPolicy.check_url`,
literal addresses and what the name resolves to then) and when the webhook is delivered,
against the address the connection is actually made to (:class:`GuardedBackend`): a name
that resolved to a public address at submit and to ``127.0.0.1`` later (DNS rebinding)
is refused at delivery. A name that does not resolve at submit is accepted: the delivery
check is the one that counts, and the submitting host may not see the workers' DNS.

Deployments with internal receivers list their networks in an explicit allow-list
(``CONVOQ_CALLBACK_ALLOWED_NETWORKS="10.20.0.0/16,127.0.0.1"``); addresses inside one of
them pass whatever their class.

Each HTTP client that must stay inside the guard (webhook delivery, MCP servers over
HTTP) uses a transport of its own over its HTTP library's public connection pool, whose
public ``network_backend=`` argument is the guarded backend; and before its first
request in a process it checks that this is where requests go (:class:`GuardCheck`): if
one does not reach the backend, nothing is sent at all.

This module sits below both the client and the workers: both import it, neither imports
the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import ssl
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
)
from types import ModuleType
from typing import Any, ClassVar, NoReturn, Protocol, TypeVar
from urllib.parse import urlsplit

import httpcore
from httpcore import AsyncNetworkBackend, AsyncNetworkStream

from convoq.errors import ConfigurationError, InvalidCallbackUrlError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# host, port -> addresses (OSError when there are none).
Resolver = Callable[[str, int], Awaitable[list["IPAddress"]]]


class Stream(Protocol):
    """What :func:`connect_checked` needs of a connection (an httpcore or httpcore2
    network stream)."""

    def get_extra_info(self, info: str) -> Any: ...

    async def aclose(self) -> None: ...


S = TypeVar("S", bound=Stream)

# Bounded: a stalled resolver must not hold a submit (or a delivery) for ever.
RESOLVE_TIMEOUT_S = 5.0


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one delivers to (IPv4-mapped, 6to4, NAT64 well-known
    prefix, Teredo client), or None when it carries none."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.teredo is not None:
        return address.teredo[1]  # (server, client): the packets go to the client
    return None


def address_class(address: IPAddress) -> str | None:
    """Why ``address`` may not receive callbacks (``"loopback"``, ``"private"``, ...), or
    None for a public address. An IPv6 address carrying an IPv4 one is judged as that."""
    address = embedded_ipv4(address) or address
    checks = (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),  # before private: Python counts 240/4 as both
        ("private", address.is_private),
        ("non-public", not address.is_global),
    )
    return next((name for name, hit in checks if hit), None)


def parse_networks(value: str | Iterable[str] | None) -> tuple[IPNetwork, ...]:
    """Networks from ``"10.0.0.0/8, 127.0.0.1"`` or a list of such strings (a bare address
    is a network of one).

    Raises:
        ConfigurationError: an entry that is not an IP network.
    """
    if value is None:
        return ()
    items = value.replace(",", " ").split() if isinstance(value, str) else list(value)
    networks: list[IPNetwork] = []
    for item in items:
        try:
            networks.append(ipaddress.ip_network(str(item).strip(), strict=False))
        except ValueError:
            raise ConfigurationError(
                f"callback allow-list entry {str(item)[:80]!r} is not an IP network"
                " (write 10.0.0.0/8, 127.0.0.1 or fd00::/8)",
                entry=str(item)[:80],
            ) from None
    return tuple(networks)


class CallbackPolicy:
    """Which addresses callbacks may go to.

    Args:
        allowed_networks: networks allowed whatever their class (see
            :func:`parse_networks`); empty: public addresses only.
    """

    def __init__(self, allowed_networks: str | Iterable[str] | None = None) -> None:
        self.allowed = parse_networks(allowed_networks)

    def refusal(self, address: IPAddress) -> str | None:
        """Why a callback may not go to ``address``, or None if it may."""
        kind = address_class(address)
        if kind is None:
            return None
        plain = embedded_ipv4(address)
        if any(a in net for net in self.allowed for a in (address, plain) if a is not None):
            return None
        return kind

    def check_address(self, address: IPAddress | str, host: str = "") -> None:
        """Raise InvalidCallbackUrlError unless a callback may go to ``address``."""
        ip = ipaddress.ip_address(address) if isinstance(address, str) else address
        kind = self.refusal(ip)
        if kind is not None:
            shown = f"{host} ({ip})" if host and host != str(ip) else str(ip)
            raise InvalidCallbackUrlError(
                f"callback_url goes to {shown}, a {kind} address: callbacks may only go to"
                " public addresses unless CONVOQ_CALLBACK_ALLOWED_NETWORKS allows it",
                address=str(ip),
                address_class=kind,
            )

    async def check_url(self, url: str, resolver: Resolver | None = None) -> None:
        """The submit-time check: a literal address, or every address the host resolves
        to now, must be allowed. A host that does not resolve passes (delivery checks)."""
        host = urlsplit(url).hostname or ""
        literal = _literal(host)
        if literal is not None:
            self.check_address(literal, host)
            return
        try:
            host.encode("idna")
        except UnicodeError:
            raise InvalidCallbackUrlError(
                f"callback_url host {host[:80]!r} is not a host name (a label is empty or"
                " over 63 characters)",
                host=host[:80],
            ) from None
        try:
            found = await (resolver or resolve)(host, 0)
        except OSError:
            return
        for address in found:
            self.check_address(address, host)


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (OSError if none, or the resolver stalls)."""
    literal = _literal(host)
    if literal is not None:
        return [literal]
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S
        )
    except TimeoutError:
        raise OSError(f"resolving {host!r} took over {RESOLVE_TIMEOUT_S}s") from None
    except UnicodeError:  # the name does not encode (IDNA): it cannot resolve either
        raise OSError(f"{host[:80]!r} is not a host name") from None
    found: list[IPAddress] = []
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    if not found:
        raise OSError(f"{host!r} resolves to no address")
    return found


async def connect_checked(
    host: str,
    port: int,
    *,
    resolver: Resolver,
    check: Callable[[IPAddress, str], None],
    connect: Callable[[str], Awaitable[S]],
    connect_error: type[Exception],
) -> S:
    """A connection to ``host`` that only reaches addresses ``check`` lets pass (it raises
    for one it refuses): every address the host resolves to is checked, then the
    connection is made to the checked address itself (``connect``; no second lookup can
    differ) and the socket's peer is checked too (the stream is closed if it is refused).
    A host that does not resolve raises ``connect_error``. Each guarded network backend
    (callbacks here, MCP servers in :mod:`convoq.mcp._guard`) connects through this."""
    try:
        addresses = await resolver(host, port)
    except OSError as exc:
        # A connect error to the HTTP client: the request may be retried later.
        raise connect_error(str(exc)) from None
    for address in addresses:
        check(address, host)
    stream = await connect(str(addresses[0]))
    peer = stream.get_extra_info("server_addr")
    try:
        check(ipaddress.ip_address(str(peer[0]) if peer else "::"), host)
    except Exception:
        await stream.aclose()
        raise
    return stream


class GuardedConnections:
    """The connecting of a guarded network backend, for httpcore and httpcore2 alike:
    every TCP connection goes through :func:`connect_checked` with :meth:`check`, over the
    core library's own AnyIO backend. A subclass adds its core library's
    ``AsyncNetworkBackend`` as second base, names the module (``core=httpcore``), and says
    what it refuses (:meth:`check`, ``connect_unix_socket``)."""

    core: ClassVar[ModuleType]

    def __init_subclass__(cls, *, core: ModuleType, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.core = core

    def __init__(self, resolver: Resolver | None = None) -> None:
        self._resolve = resolver or resolve
        self._inner = self.core.AnyIOBackend()

    def check(self, address: IPAddress, host: str) -> None:
        """Raise unless a connection may go to ``address`` (``host`` resolved to it)."""
        raise NotImplementedError

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> Any:
        return await connect_checked(
            host,
            port,
            resolver=self._resolve,
            check=self.check,
            connect=lambda address: self._inner.connect_tcp(
                address, port, timeout, local_address, socket_options
            ),
            connect_error=self.core.ConnectError,
        )

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class GuardedBackend(GuardedConnections, AsyncNetworkBackend, core=httpcore):
    """An httpcore network backend that connects only to addresses ``policy`` allows.

    It resolves the host itself, refuses the connection if any address is refused, then
    connects to the checked address (not the name: no second lookup can differ) and checks
    the peer of the socket it got. TLS still verifies the certificate against the host
    name: httpcore passes the URL's host as server_hostname, not the address.
    """

    def __init__(self, policy: CallbackPolicy, resolver: Resolver | None = None) -> None:
        super().__init__(resolver)
        self.policy = policy

    def check(self, address: IPAddress, host: str) -> None:
        self.policy.check_address(address, host)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> AsyncNetworkStream:
        raise InvalidCallbackUrlError("callbacks are never sent over a unix socket")


PROBE_URL = "http://guard-probe.invalid/"
"""Where :class:`GuardCheck` sends its probe (a name that never resolves: a transport that
bypassed the probe's backend would fail to reach it, not reach something)."""
PROBE_TIMEOUT_S = 5.0


class ProbeReached(Exception):
    """Raised by a probe's network backend when it is asked to connect: the request went
    through the backend the transport was built over."""


class GuardCheck:
    """Whether one HTTP client's requests go through the network backend its transport is
    built over, checked once per process before the first real request.

    Args:
        what: the client, for the error (``"webhook delivery"``).
        probe: sends one request to :data:`PROBE_URL` through a transport built exactly as
            the real ones are, over a backend that raises :class:`ProbeReached` when asked
            to connect.
    """

    def __init__(self, what: str, probe: Callable[[], Awaitable[object]]) -> None:
        self.what = what
        self.probe = probe
        self.ok = False

    async def ensure(self) -> None:
        """Return once the guard is known to be in force.

        Raises:
            ConfigurationError: the probe's request did not reach its backend (it was
                answered, or failed some other way): real requests would bypass the
                guard, so none is sent.
        """
        if self.ok:
            return
        try:
            await asyncio.wait_for(self.probe(), PROBE_TIMEOUT_S)
        except Exception as exc:
            if _reached(exc):
                self.ok = True
                return
            outcome = f"{type(exc).__name__}: {exc}"
        else:
            outcome = "it was answered"
        raise ConfigurationError(
            f"the address guard of {self.what} is not in force: a request did not go"
            f" through the guarded network backend ({outcome}), so nothing is sent; the"
            " installed HTTP library is not one this convoq was checked with (reinstall"
            " the releases pyproject.toml names)",
            client=self.what,
        )


def _reached(exc: BaseException | None) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ProbeReached):
            return True
        if isinstance(exc, BaseExceptionGroup):
            return any(_reached(inner) for inner in exc.exceptions)
        exc = exc.__cause__ or exc.__context__
    return False


@contextlib.contextmanager
def errors_mapped(table: Mapping[type[Exception], type[Exception]]) -> Iterator[None]:
    """Raise an HTTP core library's error as its client library's (the most specific
    class ``table`` maps, found along the error's class hierarchy); others pass as they
    are (the guard's refusals among them)."""
    try:
        yield
    except Exception as exc:
        for cls in type(exc).__mro__:
            if cls in table:
                raise table[cls](str(exc)) from exc
        raise


# -- one guarded transport for both HTTP stacks -------------------------------------------
# httpx over httpcore (webhooks) and httpx2 over httpcore2 (the MCP SDK's copies) share one
# API, so the transport over a guarded pool is written once here. Each user subclasses it
# with its client library's own base class and names its pair of modules.

# The core library's errors the client library has a class of the same name for.
_MAPPED_ERRORS = (
    "TimeoutException",
    "ConnectTimeout",
    "ReadTimeout",
    "WriteTimeout",
    "PoolTimeout",
    "NetworkError",
    "ConnectError",
    "ReadError",
    "WriteError",
    "ProxyError",
    "UnsupportedProtocol",
    "ProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
)


def client_errors(client: ModuleType, core: ModuleType) -> dict[type[Exception], type[Exception]]:
    """The table :func:`errors_mapped` takes for ``core``'s errors raised as ``client``'s."""
    return {getattr(core, name): getattr(client, name) for name in _MAPPED_ERRORS}


class PoolBody:
    """A response body read from the core library's pool, its errors raised as the client
    library's (:class:`PoolTransport` makes one class of it per client library)."""

    errors: ClassVar[Mapping[type[Exception], type[Exception]]]

    def __init__(self, stream: AsyncIterable[bytes]) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with errors_mapped(self.errors):
            async for part in self._stream:
                yield part

    async def aclose(self) -> None:
        close = getattr(self._stream, "aclose", None)
        if close is not None:
            await close()


class PoolTransport:
    """A client library's transport (its custom-transport interface) over its core
    library's connection pool built on ``backend`` (the core's public
    ``network_backend=``): every connection a request needs is opened by ``backend``, and
    nothing of the client library's own transport is used. TLS as the client library's
    default unless ``ssl_context`` is given: certificates checked against the URL's host
    name (the core passes it as server_hostname, whatever address was dialled).

    A subclass adds the client library's ``AsyncBaseTransport`` as second base and names
    the two modules: ``class T(PoolTransport, httpx.AsyncBaseTransport, client=httpx,
    core=httpcore)``.
    """

    client: ClassVar[ModuleType]
    core: ClassVar[ModuleType]
    body: ClassVar[type[PoolBody]]

    def __init_subclass__(cls, *, client: ModuleType, core: ModuleType, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.client = client
        cls.core = core
        # The client library reads only bodies that are its own AsyncByteStream.
        body = (PoolBody, client.AsyncByteStream)
        cls.body = type(f"{cls.__name__}Body", body, {"errors": client_errors(client, core)})

    def __init__(self, backend: Any, ssl_context: ssl.SSLContext | None = None) -> None:
        self._pool = self.core.AsyncConnectionPool(
            ssl_context=ssl_context or self.client.create_ssl_context(trust_env=False),
            network_backend=backend,
            # The client library's own transport's limits, which the pool does not share.
            max_connections=100,
            max_keepalive_connections=20,
            keepalive_expiry=5.0,
        )

    async def handle_async_request(self, request: Any) -> Any:
        client, core = self.client, self.core
        if not isinstance(request.stream, client.AsyncByteStream):
            raise TypeError("an async transport takes requests of an async client")
        url = request.url
        sent = core.Request(
            method=request.method,
            url=core.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with errors_mapped(self.body.errors):
            response = await self._pool.handle_async_request(sent)
        if not isinstance(response.stream, AsyncIterable):
            raise TypeError(f"{core.__name__}'s async pool answered with a sync body")
        return client.Response(
            status_code=response.status,
            headers=response.headers,
            stream=self.body(response.stream),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


class ProbeBackend:
    """A probe's network backend (see :class:`GuardCheck`): asked to connect, it raises
    :class:`ProbeReached`. A subclass adds the core library's ``AsyncNetworkBackend`` as
    second base."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> NoReturn:
        raise ProbeReached(host)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> NoReturn:
        raise ProbeReached(path)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

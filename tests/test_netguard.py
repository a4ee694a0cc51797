"""Callback URLs that cannot be turned against the network: every address class is
refused at submit and at delivery (against the address connected), unless allowed."""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpcore
import httpcore2
import httpx
import httpx2
import pytest

from convoq import Agent
from convoq.errors import ConfigurationError, InvalidCallbackUrlError
from convoq.mcp import _guard, http_server
from convoq.messages import MessageRole
from convoq.models import ScriptedModel
from convoq.netguard import (
    PROBE_URL,
    CallbackPolicy,
    GuardCheck,
    IPAddress,
    address_class,
    connect_checked,
    parse_networks,
    resolve,
)
from convoq.worker import webhooks
from convoq.worker.webhooks import guarded_transport, post_once
from tests.support.mcp_servers import HTTPServerProcess, seen
from tests.support.models import call_tool_then_answer
from tests.support.redis_server import RedisServer
from tests.support.tls import make_tls_files
from tests.support.workers import WebhookReceiver, running_pool, wait_until, webhook_receiver

PUBLIC = "93.184.216.34"

REFUSED = [
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("127.0.0.1", "loopback"),
    ("127.9.9.9", "loopback"),
    ("::1", "loopback"),
    ("169.254.169.254", "link-local"),
    ("fe80::1", "link-local"),
    ("224.0.0.1", "multicast"),
    ("ff02::1", "multicast"),
    ("10.1.2.3", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("fc00::1", "private"),
    ("fd12:3456::1", "private"),
    ("240.0.0.1", "reserved"),
    ("100.64.0.1", "non-public"),
    # IPv4-mapped IPv6 forms are judged as the IPv4 address they carry.
    ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:10.0.0.1", "private"),
    ("::ffff:169.254.169.254", "link-local"),
    # So are the IPv6 forms that embed an IPv4 address: 6to4, NAT64 and Teredo (client).
    ("2002:7f00:1::", "loopback"),
    ("2002:a9fe:a9fe::1", "link-local"),
    ("2002:a00:1::", "private"),
    ("64:ff9b::7f00:1", "loopback"),
    ("64:ff9b::a9fe:a9fe", "link-local"),
    ("2001:0:4136:e378:8000:63bf:80ff:fefe", "loopback"),  # client 127.0.1.1 (obfuscated)
    ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "private"),  # client 10.0.0.1
]


@pytest.mark.parametrize(("address", "kind"), REFUSED)
def test_every_non_public_address_class_is_named(address: str, kind: str) -> None:
    assert address_class(ipaddress.ip_address(address)) == kind
    with pytest.raises(InvalidCallbackUrlError) as raised:
        CallbackPolicy().check_address(address)
    assert raised.value.details["address_class"] == kind


PUBLIC_FORMS = [PUBLIC, "2606:2800:220:1:248:1893:25c8:1946", "8.8.8.8"]
# IPv6 forms that deliver to a public IPv4 address are public too (not "reserved").
PUBLIC_FORMS += ["2002:808:808::", "64:ff9b::808:808", "2001:0:4136:e378:8000:63bf:f7f7:f7f7"]


@pytest.mark.parametrize("address", PUBLIC_FORMS)
def test_public_addresses_pass(address: str) -> None:
    assert address_class(ipaddress.ip_address(address)) is None
    CallbackPolicy().check_address(address)


def test_the_allow_list_lets_listed_networks_through_and_no_others() -> None:
    policy = CallbackPolicy("10.20.0.0/16, 127.0.0.1 fd00::/8")
    allowed_forms = ["10.20.3.4", "127.0.0.1", "::ffff:127.0.0.1", "fd00::5"]
    for allowed in [*allowed_forms, "2002:7f00:1::", "64:ff9b::a14:304"]:
        policy.check_address(allowed)
    for refused in ["10.21.0.1", "127.0.0.2", "::1", "169.254.169.254"]:
        with pytest.raises(InvalidCallbackUrlError):
            policy.check_address(refused)


@pytest.mark.parametrize("entry", ["not-a-network", "10.0.0.0/33", "example.com"])
def test_a_bad_allow_list_entry_is_a_configuration_error(entry: str) -> None:
    with pytest.raises(ConfigurationError, match="not an IP network"):
        parse_networks(f"127.0.0.1,{entry}")


async def test_submit_check_resolves_names_and_refuses_any_internal_answer() -> None:
    policy = CallbackPolicy()

    async def mixed(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address(PUBLIC), ipaddress.ip_address("10.0.0.7")]

    with pytest.raises(InvalidCallbackUrlError, match="private"):
        await policy.check_url("https://hooks.example.test/x", resolver=mixed)
    with pytest.raises(InvalidCallbackUrlError, match="loopback"):
        await policy.check_url("http://localhost:9/x")  # the system resolver
    with pytest.raises(InvalidCallbackUrlError, match="loopback"):
        await policy.check_url("http://[::ffff:7f00:1]/x")
    for embedding in ["http://[2002:7f00:1::]/", "http://[64:ff9b::7f00:1]:8080/x"]:
        with pytest.raises(InvalidCallbackUrlError, match="loopback"):
            await policy.check_url(embedding)
    await policy.check_url(f"http://{PUBLIC}/x")
    await policy.check_url("https://does-not-resolve.invalid/x")  # delivery checks it
    for not_a_name in ["http://a..b/x", f"http://{'a' * 64}.example/"]:
        with pytest.raises(InvalidCallbackUrlError, match="not a host name"):
            await policy.check_url(not_a_name)
    with pytest.raises(OSError, match="not a host name"):
        await resolve("a..b", 80)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with webhook_receiver() as hooks:
        yield hooks


async def test_delivery_refuses_loopback_and_sends_nothing(receiver: WebhookReceiver) -> None:
    port = receiver.server.server_address[1]
    for url in [f"{receiver.url}/a", f"http://localhost:{port}/a"]:
        attempt = await post_once(url, b"{}", secret="s", timeout_s=5)
        assert attempt.outcome == "rejected"  # not retried
        assert "loopback" in attempt.detail
    assert receiver.posts("/a") == []


async def test_delivery_goes_through_when_the_allow_list_names_the_network(
    receiver: WebhookReceiver,
) -> None:
    policy = CallbackPolicy("127.0.0.0/8")
    attempt = await post_once(f"{receiver.url}/b", b"{}", secret="s", timeout_s=5, policy=policy)
    assert attempt.outcome == "delivered"
    assert len(receiver.posts("/b")) == 1


async def test_dns_rebinding_is_caught_at_delivery(receiver: WebhookReceiver) -> None:
    """The name resolved to a public address at submit; at delivery it answers loopback:
    the connection is checked, not the earlier answer."""
    answers = iter([PUBLIC, "127.0.0.1"])

    async def rebinding(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address(next(answers))]

    port = receiver.server.server_address[1]
    url = f"http://rebind.example.test:{port}/c"
    policy = CallbackPolicy()
    await policy.check_url(url, resolver=rebinding)  # accepted at submit
    attempt = await post_once(
        url, b"{}", secret="s", timeout_s=5, policy=policy, resolver=rebinding
    )
    assert attempt.outcome == "rejected"
    assert "loopback" in attempt.detail
    assert receiver.posts("/c") == []


async def test_delivery_connects_to_the_checked_address_not_a_second_lookup(
    receiver: WebhookReceiver,
) -> None:
    """Allowed, the name is resolved once and the connection made to that address: a
    resolver that answers differently a second time is never asked again."""
    calls: list[str] = []

    async def once(host: str, port: int) -> list[IPAddress]:
        calls.append(host)
        return [ipaddress.ip_address("127.0.0.1" if len(calls) == 1 else PUBLIC)]

    port = receiver.server.server_address[1]
    attempt = await post_once(
        f"http://hooks.example.test:{port}/d",
        b"{}",
        secret="s",
        timeout_s=5,
        policy=CallbackPolicy("127.0.0.1"),
        resolver=once,
    )
    assert attempt.outcome == "delivered"
    assert calls == ["hooks.example.test"]
    assert receiver.posts("/d")[0][2]["Host"] == f"hooks.example.test:{port}"


async def _public(host: str, port: int) -> list[IPAddress]:
    return [ipaddress.ip_address(PUBLIC)]


async def test_a_refused_peer_closes_the_connection_it_got() -> None:
    """The socket's peer is checked once connected: a connection that ends elsewhere than
    the checked address (a NAT rule, a transparent proxy) is refused, and closed."""
    closed = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client closes
        closed.set()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    dialled: list[str] = []

    async def elsewhere(address: str) -> httpcore.AsyncNetworkStream:
        dialled.append(address)
        return await httpcore.AnyIOBackend().connect_tcp("127.0.0.1", port)

    async with server:
        with pytest.raises(InvalidCallbackUrlError, match=r"\(127\.0\.0\.1\), a loopback address"):
            await connect_checked(
                "hooks.example.test",
                port,
                resolver=_public,
                check=CallbackPolicy().check_address,
                connect=elsewhere,
                connect_error=httpcore.ConnectError,
            )
        await asyncio.wait_for(closed.wait(), 5)
    assert dialled == [PUBLIC]  # the checked address, not the name


@pytest.mark.parametrize("flavour", [httpcore.ConnectError, httpcore2.ConnectError])
async def test_a_host_that_does_not_resolve_is_a_connect_error_of_the_caller(
    flavour: type[Exception],
) -> None:
    """Each HTTP client retries its own connect error: the callbacks' httpcore one, the MCP
    SDK's httpcore2 one. Nothing is dialled."""

    async def nowhere(host: str, port: int) -> list[IPAddress]:
        raise OSError(f"{host!r} resolves to no address")

    async def never(address: str) -> httpcore.AsyncNetworkStream:
        raise AssertionError("dialled a host that did not resolve")

    with pytest.raises(flavour, match="resolves to no address"):
        await connect_checked(
            "gone.example.test",
            80,
            resolver=nowhere,
            check=CallbackPolicy().check_address,
            connect=never,
            connect_error=flavour,
        )


@pytest.mark.slow
def test_a_worker_without_the_allow_list_refuses_a_loopback_callback(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Accepted at submit by a client that allows loopback, refused by the worker that does
    not: the delivery side checks on its own settings and sends nothing."""
    with (
        running_pool(redis_server.url, tmp_path, 1, callback_allowed_networks="") as pool,
        pool.client(callback_allowed_networks="127.0.0.1") as client,
        webhook_receiver() as hooks,
    ):
        handle = client.submit("hook-1", "hi", agent="echo", callback_url=f"{hooks.url}/w")
        handle.wait(30)
        worker = pool.workers[0]
        line = f"callback hook-1/{handle.turn_id} rejected"
        wait_until(lambda: line in worker.log_tail(200), what=line)
        assert "loopback" in worker.log_tail(200).split(line, 1)[1].splitlines()[0]
        assert hooks.posts("/w") == []


async def test_tls_is_checked_against_the_url_host_not_the_connected_address(
    tmp_path: Path,
) -> None:
    """The guard connects to the checked address, yet the certificate is still verified
    for the URL's host name: a name mapped to the right address but not on the
    certificate fails the handshake."""
    files = make_tls_files(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(files.cert, files.key)
    with webhook_receiver() as hooks:
        hooks.server.socket = server_ctx.wrap_socket(hooks.server.socket, server_side=True)
        port = hooks.server.server_address[1]
        client_ctx = ssl.create_default_context(cafile=str(files.ca))

        async def to_loopback(host: str, port: int) -> list[IPAddress]:
            return [ipaddress.ip_address("127.0.0.1")]

        transport = guarded_transport(CallbackPolicy("127.0.0.1"), to_loopback, client_ctx)
        async with httpx.AsyncClient(transport=transport, trust_env=False) as http:
            ok = await http.post(f"https://localhost:{port}/tls", content=b"{}")
            assert ok.status_code == 200
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await http.post(f"https://hooks.example.test:{port}/tls", content=b"{}")
        assert len(hooks.posts("/tls")) == 1


# -- the guard cannot be bypassed quietly -----------------------------------------------------
async def test_delivery_refuses_a_private_address_through_its_own_transport(
    receiver: WebhookReceiver,
) -> None:
    """The delivery's transport is convoq's own (httpx's custom-transport interface over
    httpcore's pool with the guarded backend): a name that resolves to a private address
    is refused on the connection, and nothing reaches the receiver behind it."""

    async def private(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address("10.0.0.7")]

    port = receiver.server.server_address[1]
    transport = guarded_transport(CallbackPolicy(), private)
    assert isinstance(transport, webhooks.GuardedTransport)
    attempt = await post_once(
        f"http://hooks.example.test:{port}/p", b"{}", secret="s", timeout_s=5, resolver=private
    )
    assert (attempt.outcome, "a private address" in attempt.detail) == ("rejected", True)
    assert receiver.posts("/p") == []


def _bypassing(backend: object, ssl_context: object = None) -> httpx.AsyncBaseTransport:
    """A transport that ignores the backend it is given: httpx's own, which dials
    whatever the URL names."""
    return httpx.AsyncHTTPTransport(trust_env=False)


async def test_the_guard_check_catches_a_transport_that_bypasses_the_backend() -> None:
    answered = httpx.MockTransport(lambda request: httpx.Response(200))

    async def through(transport: httpx.AsyncBaseTransport) -> None:
        async with httpx.AsyncClient(transport=transport, trust_env=False) as client:
            await client.get(PROBE_URL)

    with pytest.raises(ConfigurationError, match=r"not in force.*it was answered"):
        await GuardCheck("a test client", lambda: through(answered)).ensure()
    with pytest.raises(ConfigurationError, match=r"not in force.*ConnectError"):
        await GuardCheck("a test client", lambda: through(_bypassing(None))).ensure()
    check = GuardCheck("webhook delivery", webhooks.GUARD.probe)
    await check.ensure()  # convoq's own transport reaches its backend
    assert check.ok


async def test_delivery_sends_nothing_when_its_transport_would_bypass_the_guard(
    receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were delivery transports ever built so that requests skip the guarded backend, the
    process's check refuses to send at all: the loopback receiver that such a transport
    would reach gets nothing."""
    monkeypatch.setattr(webhooks, "_transport_over", _bypassing)
    monkeypatch.setattr(webhooks.GUARD, "ok", False)
    for _ in range(2):  # not only the first delivery: every one until the check passes
        attempt = await post_once(f"{receiver.url}/x", b"{}", secret="s", timeout_s=5)
        assert attempt.outcome == "rejected"
        assert "address guard of webhook delivery is not in force" in attempt.detail
    assert receiver.posts("/x") == []


@pytest.fixture
def mcp_http(tmp_path: Path) -> Iterator[HTTPServerProcess]:
    from convoq._sync import run_sync
    from convoq.mcp import close_all

    process = HTTPServerProcess(tmp_path / "mcp.log").start()
    yield process
    run_sync(close_all(process.used))
    process.stop()


def _tool_text(agent: Agent) -> str:
    turn = agent.generate("add").turn
    return next(m for m in turn if m.role == MessageRole.TOOL).text


def test_an_mcp_client_connects_nowhere_when_its_transport_would_bypass_the_guard(
    mcp_http: HTTPServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Allowed by its allow-list, the server would be reached by a transport that skips
    the guarded backend; the process's check refuses to connect at all."""
    monkeypatch.setattr(_guard, "_transport_over", lambda b: httpx2.AsyncHTTPTransport())
    monkeypatch.setattr(_guard.GUARD, "ok", False)
    server = http_server("g", mcp_http.url, allowed_networks="127.0.0.1")
    mcp_http.used.append(server)
    model = ScriptedModel(call_tool_then_answer("g__add", {"a": 1, "b": 1}))
    text = _tool_text(Agent(model, mcp_servers=[server]))
    assert "address guard of MCP servers over HTTP is not in force" in text
    assert seen(tmp_path / "mcp.log") == []

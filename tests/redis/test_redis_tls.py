"""Connecting by URL: a password, an ACL user and TLS against real redis-servers, and the
clear errors for credentials and URLs that cannot work."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

import pytest
import redis

from convoq.errors import ConfigurationError
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import ImagePart, Message, TextPart
from convoq.redis import connect
from convoq.redis._sync_client import connect_blocking
from convoq.redis.protocol import TurnEnding
from tests.support.protocol_helpers import exchange, open_protocol
from tests.support.redis_server import RedisServer
from tests.support.tls import make_tls_files

CID = "secure"
LEASE = 30_000
# Characters that must be percent-encoded in a URL, to prove the URLs carry them.
PASSWORD = "p@ss:w/rd%"
USER, USER_PASSWORD = "alice", "in#wonder?land"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server with a password for the default user and an ACL user."""
    rules = (USER, "on", f">{USER_PASSWORD}", "~*", "&*", "+@all")
    server = RedisServer(tmp_path_factory.mktemp("secured"), password=PASSWORD, users=[rules])
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server that speaks TLS only (no plain port), with a throw-away CA."""
    directory = tmp_path_factory.mktemp("tls")
    server = RedisServer(directory / "redis", tls=make_tls_files(directory / "certs"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(params=["password", "acl-user", "tls-private-ca", "tls-unverified"])
def secure_url(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(URL, the ACL user Redis should see) for each way of connecting."""
    if request.param == "password":
        return request.getfixturevalue("secured").url_as(password=PASSWORD), "default"
    if request.param == "acl-user":
        return request.getfixturevalue("secured").url_as(USER, USER_PASSWORD), USER
    tls: RedisServer = request.getfixturevalue("tls_server")
    assert tls.tls is not None
    if request.param == "tls-private-ca":
        return tls.url_as(ssl_ca_certs=str(tls.tls.ca)), "default"
    return tls.url_as(ssl_cert_reqs="none"), "default"


async def test_memory_round_trips_a_turn(secure_url: tuple[str, str], key_prefix: str) -> None:
    url, _ = secure_url
    picture = ImagePart(data=bytes(range(256)), mime_type="image/png")
    turn = [Message(content=[TextPart(text="look"), picture]), Message.assistant("a square")]
    memory = RedisConversationMemory(url=url, prefix=key_prefix)
    try:
        await memory.aappend(CID, turn)
        assert await memory.aload(CID) == turn
        await memory.aclear(CID)
        memory.append(CID, turn)  # the sync flavour: its own connections, same options
        assert memory.load(CID) == turn
        memory.clear(CID)
    finally:
        await memory.aclose()


async def test_turn_protocol_runs_submit_acquire_commit(
    secure_url: tuple[str, str], key_prefix: str
) -> None:
    url, user = secure_url
    async with open_protocol(url, key_prefix) as proto:
        assert await proto.redis.execute_command("ACL", "WHOAMI") == user.encode()
        hi = Message.user("hi")
        assert (await proto.submit(CID, "t1", agent="bot", message=hi, options={})).position == 0
        acquired = await proto.acquire(CID, worker_id="w", lease_ms=LEASE)
        assert acquired is not None
        assert acquired.turn.input == hi
        turn = exchange("hi", "hello")
        nxt = await proto.commit(CID, "t1", turn, TurnEnding(fence=acquired.fence, lease_ms=LEASE))
        assert nxt is None
        assert await proto.history(CID) == turn
        assert (await proto.get_turn(CID, "t1")).status == "succeeded"
        await proto.clear(CID)


@pytest.mark.parametrize("who", ["wrong password", "wrong user password", "no password"])
async def test_refused_credentials_are_a_configuration_error(
    secured: RedisServer, key_prefix: str, who: str
) -> None:
    url = {
        "wrong password": secured.url_as(password="guess"),
        "wrong user password": secured.url_as(USER, "guess"),
        "no password": secured.url_as(),
    }[who]
    memory = RedisConversationMemory(url=url, prefix=key_prefix)
    try:
        for load in (memory.aload, _sync_flavour(memory.load)):
            with pytest.raises(ConfigurationError, match="password in the Redis URL") as caught:
                await load(CID)
            assert "guess" not in caught.value.message
            want = USER if who == "wrong user password" else "default"
            assert caught.value.details["user"] == want
    finally:
        await memory.aclose()
    async with open_protocol(url, key_prefix) as proto:
        with pytest.raises(ConfigurationError, match=r"refused|wants a password"):
            await proto.submit(CID, "t1", agent="bot", message=Message.user("x"), options={})


async def test_a_certificate_from_an_unknown_ca_is_refused(
    tls_server: RedisServer, key_prefix: str
) -> None:
    async with open_protocol(tls_server.url_as(), key_prefix) as proto:
        with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
            await proto.history(CID)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1:6379/0", "schemes"),
        ("redis://127.0.0.1:6379/0?ssl_ca_certs=/ca.pem", "TLS needs rediss://"),
        ("rediss://127.0.0.1:6379/0?ssl_ca_certs=/no/such/ca.pem", "ssl_ca_certs=.* not a file"),
        ("redis://:hunter2@127.0.0.1:6379/0?colour=blue", "colour"),
        ("unix:///tmp/redis.sock?db=first", "db"),
    ],
)
def test_a_url_that_cannot_work_is_a_configuration_error(url: str, says: str) -> None:
    for connect_to in (connect, connect_blocking):
        with pytest.raises(ConfigurationError, match=says) as caught:
            connect_to(url)
        assert "hunter2" not in caught.value.message


async def test_socket_timeouts_given_to_connect_win_over_the_url(redis_url: str) -> None:
    client = connect(f"{redis_url}?socket_timeout=0.5", socket_timeout=30, socket_connect_timeout=3)
    try:
        options = client.connection_pool.connection_kwargs
        assert (options["socket_timeout"], options["socket_connect_timeout"]) == (30, 3)
        # A blocking read shorter than the socket timeout just returns empty.
        assert await client.xread({"no-such-stream": "$"}, block=600) == []
    finally:
        await client.aclose()
    from_url = connect(f"{redis_url}?socket_timeout=0.5")
    assert from_url.connection_pool.connection_kwargs["socket_timeout"] == 0.5
    await from_url.aclose()


def _sync_flavour(
    load: Callable[[str], list[Message]],
) -> Callable[[str], Awaitable[list[Message]]]:
    async def call(cid: str) -> list[Message]:
        return load(cid)

    return call

"""The client against a real Redis with no worker running: what submit refuses (nothing
queued, in Redis or on the broker), idempotency, if_busy, waiting, handles."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from convoq import GenerationRequest, ImagePart, Message, TextPart
from convoq.client import AsyncClient, Client
from convoq.errors import (
    AttachmentError,
    ConfigurationError,
    ConversationBusyError,
    InvalidCallbackUrlError,
    InvalidConversationIdError,
    InvalidMessageError,
    TurnTimeoutError,
    UnknownAgentError,
    UnknownTurnError,
)
from convoq.messages import MessageRole
from convoq.queue.routing import route
from convoq.redis.keys import KeySchema


@pytest.fixture
def client(redis_url: str, key_prefix: str) -> Iterator[Client]:
    with Client(
        redis_url, prefix=key_prefix, partitions=4, agents=["echo"], max_attachment_bytes=1000
    ) as c:
        yield c


def _nothing_queued(r: redis.Redis, prefix: str) -> None:
    assert r.keys(f"{prefix}:*") == []  # no turn, inbox or idempotency key
    for index in range(4):
        assert r.llen(f"{prefix}.p{index}") == 0  # no kick on the broker


@pytest.mark.parametrize(
    ("cid", "message", "agent", "error", "options"),
    [
        (
            "ok",
            Message(role=MessageRole.ASSISTANT, content=[TextPart(text="hi")]),
            "echo",
            InvalidMessageError,
            {},
        ),
        ("ok", Message(content=[]), "echo", InvalidMessageError, {}),
        # a GenerationRequest bypasses memory: it is not a turn of a stored conversation
        ("ok", GenerationRequest(messages=[Message.user("hi")]), "echo", InvalidMessageError, {}),
        ("ok", "", "echo", InvalidMessageError, {}),
        ("ok", "hello", "nobody", UnknownAgentError, {}),
        ("bad\nid!", "hello", "echo", InvalidConversationIdError, {}),
        ("x" * 257, "hello", "echo", InvalidConversationIdError, {}),
        (
            "ok",
            Message(
                content=[
                    TextPart(text="big"),
                    ImagePart(data=b"\x89PNG" + b"0" * 2000, mime_type="image/png"),
                ]
            ),
            "echo",
            AttachmentError,
            {},
        ),
        *[
            ("ok", "hello", "echo", InvalidCallbackUrlError, {"callback_url": url})
            for url in [
                "ftp://example.test/hook",  # not http(s)
                "javascript:alert(1)",
                "/relative/hook",
                "https://",  # no host
                "http://:8080/hook",
                "https://example.test/" + "a" * 2048,  # over 2048 characters
                "",
                "http://[::1/hook",  # does not parse
                "http://example.test:99999/hook",
                "http://example.test/a hook",
                "http://example.test/\r\nX-Injected: 1",
                b"http://example.test/hook",  # not a str
                # addresses callbacks may not reach without an allow-list
                "http://127.0.0.1:8080/hook",
                "http://localhost:8080/hook",
                "http://[::1]/hook",
                "http://[::ffff:127.0.0.1]/hook",
                "http://10.0.0.1/hook",
                "http://169.254.169.254/latest/meta-data",
                "http://[fe80::1]/hook",
                "http://224.0.0.1/hook",
                "http://240.0.0.1/hook",
                "http://0.0.0.0/hook",
                "http://[fd00::1]/hook",
            ]
        ],
    ],
)
def test_bad_input_is_refused_and_nothing_is_queued(
    client: Client, redis_client: redis.Redis, key_prefix: str,
    cid: str, message: object, agent: str, error: type[Exception], options: dict[str, object],
) -> None:  # fmt: skip
    with pytest.raises(error) as raised:
        client.submit(cid, message, agent=agent, **options)  # type: ignore[arg-type]
    assert str(raised.value)  # a message that says what is wrong
    _nothing_queued(redis_client, key_prefix)


def test_callback_urls_that_can_be_delivered_are_accepted(redis_url: str, key_prefix: str) -> None:
    # example.test does not resolve here: accepted, delivery checks the address it gets.
    urls = ["https://example.test/hook?x=1", "http://127.0.0.1:8080/h", "http://[::1]/h"]
    with Client(
        redis_url, prefix=key_prefix, partitions=4, agents=["echo"],
        callback_allowed_networks="127.0.0.1, ::1", webhook_secret="the-workers-secret",
    ) as client:  # fmt: skip
        for url in urls:
            handle = client.submit("c1", "hello", agent="echo", callback_url=url)
            assert handle.record().options["callback_url"] == url


def test_unknown_agent_is_checked_against_the_workers_registry(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    with Client(redis_url, prefix=key_prefix, partitions=4) as client:
        redis_client.sadd(KeySchema(key_prefix).agents(), "echo", "tracker")
        with pytest.raises(UnknownAgentError, match="echo"):
            client.submit("c1", "hi", agent="assistant")
        assert redis_client.keys(f"{key_prefix}:{{*") == []
        assert client.submit("c1", "hi", agent="echo").status() == "queued"


def test_submit_queues_once_and_kicks_the_conversation_queue(
    client: Client, redis_client: redis.Redis, key_prefix: str
) -> None:
    first = client.submit("c1", "hello", agent="echo", idempotency_key="k")
    again = client.submit("c1", "hello", agent="echo", idempotency_key="k")
    assert again.turn_id == first.turn_id
    assert redis_client.llen(KeySchema(key_prefix).inbox("c1")) == 1
    queue = route("c1", prefix=key_prefix, partitions=4)
    assert redis_client.llen(queue) >= 1  # the drain kick, by name, args [cid] only
    second = client.submit("c1", "more", agent="echo")
    assert [first.status(), second.status()] == ["queued", "queued"]


def test_if_busy_reject_refuses_while_a_turn_is_queued(
    client: Client, redis_client: redis.Redis, key_prefix: str
) -> None:
    client.submit("c1", "first", agent="echo")
    with pytest.raises(ConversationBusyError):
        client.submit("c1", "second", agent="echo", if_busy="reject")
    assert redis_client.llen(KeySchema(key_prefix).inbox("c1")) == 1
    assert client.submit("c2", "free", agent="echo", if_busy="reject").status() == "queued"


def test_wait_times_out_without_workers_and_handles_work_anywhere(client: Client) -> None:
    handle = client.submit("c1", "hello", agent="echo")
    with pytest.raises(TurnTimeoutError):
        handle.wait(0.3)
    same = client.handle("c1", handle.turn_id)
    assert same.status() == "queued"
    with pytest.raises(UnknownTurnError):
        client.handle("c1", "0" * 20).status()
    with pytest.raises(InvalidConversationIdError):
        client.handle("c1", "../etc")


def test_waiting_blocks_for_less_than_a_socket_timeout_set_in_the_url(
    redis_url: str, key_prefix: str
) -> None:
    url = f"{redis_url}?socket_timeout=0.3"
    with Client(url, prefix=key_prefix, partitions=4, agents=["echo"]) as client:
        handle = client.submit("c1", "hello", agent="echo")
        # Each XREAD BLOCK ends before the socket would time out: no Redis TimeoutError.
        with pytest.raises(TurnTimeoutError):
            handle.wait(0.7)
        with pytest.raises(TurnTimeoutError):
            list(handle.events(timeout=0.7))


def test_cancel_of_a_queued_turn(client: Client) -> None:
    handle = client.submit("c1", "hello", agent="echo")
    assert client.cancel(handle) == "cancelled"
    assert handle.wait(1, raise_on_error=False).status == "cancelled"
    assert client.cancel(handle) == "finished"


async def test_async_client_submit_and_status(redis_url: str, key_prefix: str) -> None:
    async with AsyncClient(redis_url, prefix=key_prefix, partitions=4, agents=["echo"]) as client:
        handle = await client.submit(f"a-{uuid.uuid4().hex[:6]}", "hi", agent="echo")
        assert await handle.status() == "queued"
        assert (await handle.result()).status == "queued"
        assert await client.history(handle.conversation_id) == []


@pytest.mark.parametrize("partitions", [0, -1, True])
def test_a_bad_partition_count_is_refused_when_the_client_is_made(
    redis_url: str, key_prefix: str, partitions: int
) -> None:
    with pytest.raises(ConfigurationError, match="partitions"):
        AsyncClient(redis_url, prefix=key_prefix, partitions=partitions)

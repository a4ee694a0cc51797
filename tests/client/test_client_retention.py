"""A conversation's retention is the workers' decision, whichever process writes a key: a
client with other TTL settings gives the idempotency keys it writes and the records of the
turns it cancels the workers' TTLs, so no key outlives its conversation (nor expires
before the workers' time)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis

from convoq.client import Client
from convoq.redis import TurnProtocol, _retention
from convoq.redis.keys import KeySchema
from convoq.settings import ConvoqSettings
from tests.support.redis_server import RedisServer
from tests.support.workers import WEBHOOK_SECRET, running_pool, wait_until

pytestmark = pytest.mark.slow

DAY_S = 86_400
SLACK_MS = 60_000  # far more than the test takes: a key set now has at least this much left


@pytest.mark.parametrize(
    ("workers", "client", "turn_ms", "conversation_ms"),
    [
        # Workers keep a conversation 10 minutes idle; the client has no idle TTL.
        ({"conversation_ttl_s": 600, "turn_ttl_s": 3600}, {"turn_ttl_s": DAY_S}, 600_000, 600_000),
        # Workers keep turns an hour and conversations for ever; the client, 2 minutes.
        ({"turn_ttl_s": 3600}, {"conversation_ttl_s": 120, "turn_ttl_s": 60}, 3_600_000, None),
    ],
    ids=["workers-shorter", "client-shorter"],
)
def test_keys_a_client_writes_get_the_workers_ttls(
    redis_server: RedisServer,
    tmp_path: Path,
    workers: dict[str, int],
    client: dict[str, int],
    turn_ms: int,
    conversation_ms: int | None,
) -> None:
    with running_pool(redis_server.url, tmp_path, 1, **workers) as pool:
        settings = ConvoqSettings.resolve(
            redis_url=redis_server.url,
            prefix=pool.prefix,
            partitions=pool.partitions,
            webhook_secret=WEBHOOK_SECRET,
            **client,
        )
        word = uuid.uuid4().hex[:8]
        cid = f"kept-{word}"
        store = redis.Redis.from_url(redis_server.url)
        try:
            with Client(settings=settings) as c:
                held = c.submit(cid, f"{word} first", agent="blocker", idempotency_key="k1")
                wait_until(lambda: held.status() == "running", 30, what="the first turn running")
                behind = c.submit(cid, "second", agent="echo", idempotency_key="k2")
                assert c.cancel(behind) == "cancelled"
                store.set(f"{pool.prefix}:test:release:{word}", 1, ex=60)
                assert held.wait(30).text == f"released {word} first"
            keys = KeySchema(pool.prefix)
            if conversation_ms is not None:  # the worker refreshes the idle TTL after its commit
                wait_until(lambda: store.pttl(keys.turns(cid)) > 0, 30, what="the idle TTL")
            found = {k.decode() for k in store.scan_iter(match=keys.conversation_pattern(cid))}
            ttls = {key: store.pttl(key) for key in found}
        finally:
            store.close()
    retained = set(keys.retained_keys(cid))
    per_turn = found - retained
    assert {keys.idem(cid, "k1"), keys.idem(cid, "k2"), keys.turn(cid, behind.turn_id)} <= per_turn
    assert keys.events(cid, behind.turn_id) in per_turn and keys.meta(cid) in found
    wrong = [f"{k}: {ttls[k]}" for k in per_turn if not turn_ms - SLACK_MS < ttls[k] <= turn_ms]
    for key in found & retained:
        if conversation_ms is None and ttls[key] != -1:
            wrong.append(f"{key}: {ttls[key]}, not kept for ever")
        if conversation_ms is not None and not conversation_ms - SLACK_MS < ttls[key]:
            wrong.append(f"{key}: {ttls[key]}, not about {conversation_ms}")
        if conversation_ms is not None and ttls[key] > conversation_ms:
            wrong.append(f"{key}: {ttls[key]}, longer than {conversation_ms}")
    assert not wrong, wrong


async def test_a_client_keeps_its_own_ttls_until_workers_publish_theirs_then_follows_them(
    redis_url: str, key_prefix: str
) -> None:
    client = TurnProtocol.from_url(
        redis_url, prefix=key_prefix, turn_ttl_s=DAY_S, conversation_ttl_s=None
    )
    worker = TurnProtocol.from_url(
        redis_url, prefix=key_prefix, turn_ttl_s=3600, conversation_ttl_s=600
    )
    try:
        await client.follow_retention()  # nothing published yet: its own stay
        assert (client.turn_ttl_ms, client.conversation_ttl_ms) == (DAY_S * 1000, None)
        await worker.publish_retention()
        await client.follow_retention()
        assert (client.turn_ttl_ms, client.conversation_ttl_ms) == (600_000, 600_000)
        # Read at most once per period: a change published now is followed later.
        other = TurnProtocol.from_url(redis_url, prefix=key_prefix, turn_ttl_s=7200)
        await other.publish_retention()
        await other.close()
        await client.follow_retention()
        assert client.turn_ttl_ms == 600_000
        client._retention_read_at = -_retention.FOLLOW_EVERY_S  # the period has passed
        await client.follow_retention()
        assert (client.turn_ttl_ms, client.conversation_ttl_ms) == (7_200_000, None)
    finally:
        await client.close()
        await worker.close()

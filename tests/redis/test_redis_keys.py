"""Key names: one schema, every conversation key hash-tagged, ids checked first."""

from __future__ import annotations

import re

import pytest
import redis

from convoq.errors import ConfigurationError, InvalidConversationIdError
from convoq.messages import Message
from convoq.redis import KeySchema
from convoq.redis.protocol import TurnEnding
from convoq.turn_state import TurnEvent
from tests.support.protocol_helpers import exchange, open_protocol


def test_every_conversation_key_carries_the_hash_tag() -> None:
    keys = KeySchema("p")
    cid, tid = "user:42/chat", "t1"
    names = [
        *keys.history_keys(cid),
        keys.inbox(cid),
        keys.lease(cid),
        keys.swept(cid),
        *keys.turn_keys(cid, tid),
        keys.idem(cid, "anything at all"),
    ]
    assert len(set(names)) == len(names)
    for name in names:
        assert name.startswith("p:{user:42/chat}:")


def test_idempotency_keys_are_hashed() -> None:
    name = KeySchema("p").idem("c", "a key with spaces and {braces}")
    assert re.fullmatch(r"p:\{c\}:idem:[0-9a-f]{64}", name)


def test_ids_are_checked_before_a_key_is_built() -> None:
    keys = KeySchema()
    for bad in ["", "tab\there", "nul\x00", "x" * 257, "\ud800"]:
        with pytest.raises(InvalidConversationIdError):
            keys.inbox(bad)
    with pytest.raises(InvalidConversationIdError):
        keys.turn("c", "bad turn id")


@pytest.mark.parametrize(
    "cid", ["user 42", "o'brien", "a{b}c", "}", "star*?[x]", "ü/..", "%41", "A", "a", "\\"]
)
def test_any_id_is_encoded_into_one_hash_tag_and_decodes_back(cid: str) -> None:
    keys = KeySchema("p")
    inbox = keys.inbox(cid)
    tag = inbox[len("p:{") : -len("}:inbox")]
    assert re.fullmatch(r"[A-Za-z0-9._:@/+=%-]+", tag), tag
    assert keys.conversation_of_inbox(inbox) == cid
    assert keys.conversation_of_inbox(inbox.encode()) == cid


def test_encoded_ids_never_collide_and_old_ids_keep_their_keys() -> None:
    keys = KeySchema("p")
    ids = ["a b", "a%20b", "a+b", "a_b", "A", "a", "x{", "x%7B", "user:42/chat"]
    assert len({keys.base(cid) for cid in ids}) == len(ids)
    assert keys.base("user:42/chat") == "p:{user:42/chat}"


def test_prefix_is_checked() -> None:
    for bad in ["", "a b", "x{y}", "glob*"]:
        with pytest.raises(ConfigurationError):
            KeySchema(bad)


def test_patterns_match_only_their_own_keys() -> None:
    keys = KeySchema("p")
    assert keys.conversation_of_inbox(keys.inbox("a:b")) == "a:b"
    assert keys.conversation_of_inbox(keys.turn("a", "inbox")) is None
    assert keys.conversation_of_inbox(b"q:{a}:inbox") is None
    assert keys.conversation_pattern("a") == "p:{a}:*"


async def test_keys_written_by_a_full_cycle_all_carry_the_tag(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    cid = "tagged"
    async with open_protocol(redis_url, key_prefix) as proto:
        await proto.submit(
            cid, "t1", agent="a", message=Message.user("hi"), options={}, idempotency_key="k1"
        )
        acquired = await proto.acquire(cid, worker_id="w", lease_ms=10_000)
        assert acquired is not None
        await proto.emit(cid, "t1", TurnEvent(type="assistant", data={"text": "x"}))
        await proto.submit(cid, "t2", agent="a", message=Message.user("next"), options={})
        turn = exchange("hi", "yo")
        await proto.commit(cid, "t1", turn, TurnEnding(fence=acquired.fence, lease_ms=10_000))
    found = [k.decode() for k in redis_client.keys(f"{key_prefix}*")]
    kinds = {k.split(":")[2] for k in found}
    assert {"meta", "turns", "inbox", "lease", "turn", "events", "idem"} <= kinds
    for name in found:
        assert name.startswith(f"{key_prefix}:{{{cid}}}:"), name

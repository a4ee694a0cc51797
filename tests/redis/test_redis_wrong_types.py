"""Every key the hot-path scripts (submit, acquire, commit) touch, given another type by a
stray write: the script names that key (CorruptDataError) and changes nothing. The
scripts find out from their first read or first write of the key, not a TYPE check; and
the commands a plain turn and a waiter send, counted by the server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis

from convoq.errors import CorruptDataError
from convoq.messages import FilePart, Message, TextPart
from convoq.redis import KeySchema, TurnProtocol
from convoq.redis.protocol import TurnEnding
from tests.redis.test_redis_bad_input import snapshot
from tests.support.protocol_helpers import exchange, open_protocol, submit_all

CID = "wrong-types"
LEASE = 30_000
Key = Callable[[KeySchema], str]

HISTORY: dict[str, Key] = {
    "meta": lambda k: k.meta(CID),
    "turns": lambda k: k.turns(CID),
    "inbox": lambda k: k.inbox(CID),
}


def break_key(client: redis.Redis, key: str) -> None:
    """Give ``key`` another type than convoq's: a hash for the string keys (journal,
    continuation), else a string."""
    client.delete(key)
    if ":journal:" in key or ":cont:" in key:
        client.hset(key, "not", "a string")
    else:
        client.set(key, "not what convoq stored here")


async def refused_naming(
    redis_client: redis.Redis,
    proto: TurnProtocol,
    key: str,
    call: Callable[[], Awaitable[object]],
) -> None:
    """With ``key`` of another type, ``call`` fails naming it and changes nothing."""
    break_key(redis_client, key)
    before = snapshot(redis_client, proto.keys.prefix)
    with pytest.raises(CorruptDataError) as caught:
        await call()
    assert caught.value.details["key"] == key
    assert snapshot(redis_client, proto.keys.prefix) == before


def with_file() -> list[Message]:
    user = Message(content=[TextPart(text="see"), FilePart(data=b"%PDF", mime_type="x/y")])
    return [user, Message.assistant("seen")]


@pytest.fixture
async def proto(redis_url: str, key_prefix: str) -> AsyncIterator[TurnProtocol]:
    async with open_protocol(redis_url, key_prefix) as protocol:
        # One committed turn with an attachment: later windows read the blobs hash.
        await submit_all(protocol, CID, "t0")
        acquired = await protocol.acquire(CID, worker_id="w", lease_ms=LEASE)
        assert acquired is not None
        await protocol.commit(
            CID, "t0", with_file(), TurnEnding(fence=acquired.fence, lease_ms=LEASE)
        )
        yield protocol


ACQUIRE = {
    **HISTORY,
    "lead": lambda k: k.lead(CID),
    "blobs": lambda k: k.blobs(CID),
    "lease": lambda k: k.lease(CID),
    "turn": lambda k: k.turn(CID, "t1"),
    "events": lambda k: k.events(CID, "t1"),
}
# Read only for a turn that ran before: only a run writes them.
SAVED_STATE = {
    "journal": lambda k: k.journal(CID, "t1"),
    "cont": lambda k: k.cont(CID, "t1"),
}


@pytest.mark.parametrize("name", sorted(ACQUIRE))
async def test_acquire_names_a_key_of_another_type_and_writes_nothing(
    proto: TurnProtocol, redis_client: redis.Redis, name: str
) -> None:
    await submit_all(proto, CID, "t1")
    if name == "lead":  # read only when meta does not say it is empty (as the first commit did)
        redis_client.hdel(proto.keys.meta(CID), "lead")
    key = ACQUIRE[name](proto.keys)
    await refused_naming(
        redis_client, proto, key, lambda: proto.acquire(CID, worker_id="w", lease_ms=LEASE)
    )


@pytest.mark.parametrize("name", sorted(SAVED_STATE))
async def test_acquire_of_a_turn_that_ran_before_names_its_saved_state_of_another_type(
    proto: TurnProtocol, redis_client: redis.Redis, name: str
) -> None:
    await submit_all(proto, CID, "t1")
    first = await proto.acquire(CID, worker_id="w", lease_ms=LEASE)
    assert first is not None
    assert await proto.release(CID, "t1", fence=first.fence)  # handed back unfinished
    key = SAVED_STATE[name](proto.keys)
    await refused_naming(
        redis_client, proto, key, lambda: proto.acquire(CID, worker_id="w", lease_ms=LEASE)
    )


@pytest.mark.parametrize("name", sorted(SAVED_STATE))
async def test_a_turn_never_started_reads_no_saved_state_and_its_commit_leaves_a_stray_key(
    proto: TurnProtocol, redis_client: redis.Redis, name: str
) -> None:
    await submit_all(proto, CID, "t1")
    key = SAVED_STATE[name](proto.keys)
    break_key(redis_client, key)  # no run wrote it: it is not the turn's state
    acquired = await proto.acquire(CID, worker_id="w", lease_ms=LEASE)
    assert acquired is not None and acquired.state is None
    await proto.commit(CID, "t1", exchange("t1"), TurnEnding(fence=acquired.fence, lease_ms=LEASE))
    assert (await proto.get_turn(CID, "t1")).status == "succeeded"
    # Neither read nor deleted: no checkpoint marked the turn, it never parked.
    assert redis_client.type(key) == b"hash"


SUBMIT = {**HISTORY, "events": lambda k: k.events(CID, "t1")}
SUBMIT.pop("turns")


@pytest.mark.parametrize("name", sorted(SUBMIT))
async def test_submit_names_a_key_of_another_type_and_writes_nothing(
    proto: TurnProtocol, redis_client: redis.Redis, name: str
) -> None:
    key = SUBMIT[name](proto.keys)
    await refused_naming(redis_client, proto, key, lambda: submit_all(proto, CID, "t1"))


COMMIT = {
    **HISTORY,
    "blobs": lambda k: k.blobs(CID),
    "lease": lambda k: k.lease(CID),
    "turn": lambda k: k.turn(CID, "t1"),
    "events": lambda k: k.events(CID, "t1"),
}


@pytest.mark.parametrize("name", sorted(COMMIT))
async def test_commit_names_a_key_of_another_type_and_writes_nothing(
    proto: TurnProtocol, redis_client: redis.Redis, name: str
) -> None:
    await submit_all(proto, CID, "t1")
    acquired = await proto.acquire(CID, worker_id="w", lease_ms=LEASE)
    assert acquired is not None
    key = COMMIT[name](proto.keys)
    await refused_naming(
        redis_client,
        proto,
        key,
        lambda: proto.commit(
            CID, "t1", with_file(), TurnEnding(fence=acquired.fence, lease_ms=LEASE)
        ),
    )


def _calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def test_a_plain_turn_checks_no_key_type_of_its_own(
    proto: TurnProtocol, redis_client: redis.Redis
) -> None:
    """submit, acquire and commit of a plain turn send no TYPE (the first read of a key, or
    the first write, is its type check: commit's history push included) and do not stamp
    the format again; acquire takes its clock from the "running" event's id (no TIME), and
    commit's events go as one stream entry."""
    before = _calls(redis_client)
    await submit_all(proto, CID, "t1")
    acquired = await proto.acquire(CID, worker_id="w", lease_ms=LEASE)
    assert acquired is not None
    ending = TurnEnding(fence=acquired.fence, lease_ms=LEASE)
    await proto.commit(CID, "t1", exchange("t1"), ending)
    after = _calls(redis_client)
    sent = {name: n - before.get(name, 0) for name, n in after.items()}
    assert sent.get("type", 0) == 0 and sent.get("rpop", 0) == 0
    assert sent.get("time", 0) == 1  # commit's
    assert sent.get("llen", 0) == 0  # the window is read from the end: no length first
    assert sent.get("xadd", 0) == 3  # queued, running, commit's events in one entry
    # Meta was stamped by the first turn; started_ms goes with the run's other fields.
    assert sent.get("hsetnx", 0) == 0
    # The window of a conversation with no lead reads no lead list (meta says so), and the
    # ending deletes no journal or continuation the turn never had: only the lease goes.
    assert sent.get("lrange", 0) == 3  # the inbox twice (acquire, commit), the window
    assert sent.get("del", 0) == 1
    assert sum(n for name, n in sent.items() if name != "info") <= 35


async def test_a_waiter_reads_record_and_last_event_without_a_transaction(
    proto: TurnProtocol, redis_client: redis.Redis
) -> None:
    await submit_all(proto, CID, "t1")
    before = _calls(redis_client)
    record, after = await proto.get_turn_and_last_event(CID, "t1")
    sent = {name: n - before.get(name, 0) for name, n in _calls(redis_client).items()}
    assert record.status == "queued" and after != "0"
    assert sent.get("multi", 0) == 0 and sent.get("exec", 0) == 0
    assert sent.get("xrevrange") == 1 and sent.get("hgetall") == 1

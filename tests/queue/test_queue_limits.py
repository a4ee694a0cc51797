"""Limits on queued turns: per conversation (inside the ``submit`` script), per agent and
in all (counted in their own slot, admitted before ``submit``, uncounted when a turn ends
or a submit is refused, reconciled by the sweeper). A refused submit raises
QueueFullError and stores nothing. On one redis-server and on the Redis Cluster, whose
conversations sit in other slots than the counts."""

from __future__ import annotations

import pickle
from collections.abc import AsyncIterator

import pytest
import redis

from convoq.errors import ConfigurationError, QueueFullError, error_from_data
from convoq.limits import QueueLimits
from convoq.messages import Message
from convoq.redis import TurnProtocol
from convoq.settings import ConvoqSettings
from convoq.worker.sweeper import Sweeper


@pytest.fixture
async def opened(store_url: str, key_prefix: str) -> AsyncIterator[dict[str, TurnProtocol]]:
    """Protocols on one store and prefix, by limits: ``proto(limits)`` below."""
    made: dict[str, TurnProtocol] = {}
    yield made
    for protocol in made.values():
        await protocol.close()


def proto(
    opened: dict[str, TurnProtocol], store_url: str, key_prefix: str, **limits: int | None
) -> TurnProtocol:
    protocol = TurnProtocol.from_url(
        store_url, prefix=key_prefix, queue_limits=QueueLimits(**limits)
    )
    opened[str(len(opened))] = protocol
    return protocol


async def put(p: TurnProtocol, cid: str, tid: str, agent: str = "bot", **kw: object) -> str:
    done = await p.submit(cid, tid, agent=agent, message=Message.user(tid), options={}, **kw)
    return done.turn_id


def stored_keys(client: redis.Redis, prefix: str, cid: str, tid: str) -> list[bytes]:
    return list(client.scan_iter(match=f"{prefix}:{{{cid}}}:*{tid}*"))


async def test_a_full_conversation_refuses_and_stores_nothing(
    opened: dict[str, TurnProtocol], store_url: str, key_prefix: str, store_client: redis.Redis
) -> None:
    p = proto(opened, store_url, key_prefix, per_conversation=2)
    await put(p, "c1", "t1")
    await put(p, "c1", "t2")
    with pytest.raises(QueueFullError, match="CONVOQ_MAX_QUEUED_PER_CONVERSATION") as caught:
        await put(p, "c1", "t3")
    assert (caught.value.limit, caught.value.max_queued) == ("conversation", 2)
    assert caught.value.retry_after_s > 0
    assert stored_keys(store_client, key_prefix, "c1", "t3") == []
    assert store_client.lrange(p.keys.inbox("c1"), 0, -1) == [b"t1", b"t2"]
    await put(p, "c2", "t4")  # another conversation has room
    # Without the limit the same submit is queued.
    unlimited = proto(opened, store_url, key_prefix, per_conversation=None)
    await put(unlimited, "c1", "t3")
    assert store_client.llen(p.keys.inbox("c1")) == 3


async def test_per_agent_and_total_limits_span_conversations(
    opened: dict[str, TurnProtocol], store_url: str, key_prefix: str, store_client: redis.Redis
) -> None:
    p = proto(opened, store_url, key_prefix, per_agent=2, total=3)
    await put(p, "a1", "t1", agent="alpha")
    await put(p, "a2", "t2", agent="alpha")
    with pytest.raises(QueueFullError, match="CONVOQ_MAX_QUEUED_PER_AGENT") as caught:
        await put(p, "a3", "t3", agent="alpha")
    assert (caught.value.limit, caught.value.max_queued) == ("agent", 2)
    assert stored_keys(store_client, key_prefix, "a3", "t3") == []
    await put(p, "b1", "t4", agent="beta")
    with pytest.raises(QueueFullError, match="CONVOQ_MAX_QUEUED_TOTAL") as caught:
        await put(p, "b2", "t5", agent="beta")
    assert caught.value.limit == "total"
    assert await p.queued_counts() == {"*": 3, "alpha": 2, "beta": 1}
    # An ended turn frees its place; uncounting it again changes nothing.
    assert await p.unadmit([("a1", "t1")]) == 1
    assert await p.unadmit([("a1", "t1")]) == 0
    await put(p, "a3", "t3", agent="alpha")
    assert await p.queued_counts() == {"*": 3, "alpha": 2, "beta": 1}


async def test_a_refused_or_duplicate_submit_is_not_counted(
    opened: dict[str, TurnProtocol], store_url: str, key_prefix: str
) -> None:
    p = proto(opened, store_url, key_prefix, per_conversation=1, per_agent=10)
    await put(p, "c1", "t1", idempotency_key="k1")
    with pytest.raises(QueueFullError):
        await put(p, "c1", "t2")  # the conversation's limit, after the agent's admitted it
    assert await put(p, "c1", "t3", idempotency_key="k1") == "t1"  # the first turn again
    assert await put(p, "c1", "t1") == "t1"  # a resent submit
    assert await p.queued_counts() == {"*": 1, "bot": 1}


async def test_the_sweeper_reconciles_turns_that_ended_uncounted(
    opened: dict[str, TurnProtocol], store_url: str, key_prefix: str, store_client: redis.Redis
) -> None:
    p = proto(opened, store_url, key_prefix, total=10)
    # Members this code did not write are left alone, not a reason to fail the sweep.
    store_client.hset(p.keys.queue_keys()[0], mapping={"junk": "x", "a{ t!": "1 bot"})
    await put(p, "gone", "t1")
    await put(p, "kept", "t2")
    await p.clear("gone", force=True)  # ends its turn without uncounting it
    # Within the grace a missing record may be a submit on its way: left counted.
    assert await p.reconcile_admitted(grace_ms=60_000) == 0
    assert await p.reconcile_admitted(grace_ms=0) == 1
    assert await p.queued_counts() == {"*": 1, "bot": 1}
    assert await p.reconcile_admitted(grace_ms=0) == 0  # the queued one stays counted


def test_queue_full_keeps_its_fields_across_processes() -> None:
    err = QueueFullError("full", limit="agent", max_queued=5, retry_after_s=2.5)
    for back in (pickle.loads(pickle.dumps(err)), error_from_data(err.to_data())):
        assert isinstance(back, QueueFullError)
        assert (back.limit, back.max_queued, back.retry_after_s) == ("agent", 5, 2.5)


def test_limits_resolve_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ConvoqSettings.resolve().max_queued_per_conversation == 1000
    assert ConvoqSettings.resolve().max_queued_total is None
    monkeypatch.setenv("CONVOQ_MAX_QUEUED_TOTAL", "50")
    assert ConvoqSettings.resolve().max_queued_total == 50
    monkeypatch.setenv("CONVOQ_MAX_QUEUED_PER_AGENT", "-1")
    with pytest.raises(ConfigurationError, match="CONVOQ_MAX_QUEUED_PER_AGENT"):
        ConvoqSettings.resolve()


async def test_each_sweep_reconciles_the_counts(
    opened: dict[str, TurnProtocol], store_url: str, key_prefix: str
) -> None:
    p = proto(opened, store_url, key_prefix, per_agent=5)
    await put(p, "gone", "t1")
    await p.clear("gone", force=True)
    kicked: list[str] = []

    async def kick(cid: str) -> None:
        kicked.append(cid)

    sweeper = Sweeper(p, kick, interval_s=1.0, reconcile_grace_ms=0)
    assert await sweeper.sweep_once() == []
    assert await p.queued_counts() == {}


async def test_reconciling_without_counts_writes_nothing(
    opened: dict[str, TurnProtocol], store_url: str, key_prefix: str, store_client: redis.Redis
) -> None:
    p = proto(opened, store_url, key_prefix)
    await put(p, "c1", "t1")  # no per-agent or total limit: nothing counted
    assert await p.reconcile_admitted(grace_ms=0) == 0
    assert store_client.exists(*p.keys.queue_keys()) == 0

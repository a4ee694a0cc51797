"""The submit script's double-texting modes against a real Redis: interrupt and rollback
stop the inbox head once, merge joins a queued turn atomically; a resent submit changes
nothing; bad input and a moved inbox are refused with nothing written."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from convoq.errors import ConvoqError, QueueFullError
from convoq.limits import QueueLimits
from convoq.messages import FilePart, ImagePart, Message, TextPart
from convoq.redis import Acquired, TurnEnding, TurnProtocol
from convoq.redis._texting import merge_key_of
from convoq.turn_state import TurnState
from tests.redis.test_redis_bad_input import snapshot
from tests.support.protocol_helpers import open_protocol, submit_all
from tests.support.redis_proxy import LossyProxy
from tests.support.redis_server import RedisServer

CID = "conv-texting"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x01" * 40
PDF = b"%PDF-1.4\n" + b"\x02" * 40


@pytest.fixture
def protocol_url(store_url: str) -> str:
    """Each test runs on one redis-server and again on the Redis Cluster."""
    return store_url


async def running(proto: TurnProtocol, tid: str = "t0") -> Acquired:
    """``tid`` queued and taken by a worker: the running inbox head."""
    await submit_all(proto, CID, tid)
    taken = await proto.acquire(CID, worker_id="w", lease_ms=30_000)
    assert taken is not None and taken.turn.turn_id == tid
    return taken


async def send(
    proto: TurnProtocol, tid: str, mode: str, message: Message | None = None, **kw: object
) -> object:
    key = "k" if mode == "merge" else None
    return await proto.submit(
        CID, tid, agent="bot", message=message or Message.user(tid), options={},
        if_busy=mode, merge_key=key, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def events_of(client: redis.Redis, proto: TurnProtocol, tid: str, kind: str) -> list[dict]:
    entries = client.xrange(proto.keys.events(CID, tid))
    return [json.loads(f[b"data"]) for _, f in entries if f.get(b"type") == kind.encode()]


async def test_merged_messages_join_the_queued_turn_in_order_once(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await running(proto)
    first = await send(proto, "t1", "merge")  # behind a running head: queued as usual
    image = Message(content=[TextPart(text="t2"), ImagePart(data=PNG, mime_type="image/png")])
    pdf = FilePart(data=PDF, mime_type="application/pdf", filename="a.pdf")
    second = await send(proto, "t2", "merge", image)
    again = await send(proto, "t2", "merge", image)  # resent after a lost reply
    third = await send(proto, "t3", "merge", Message(content=[pdf, TextPart(text="t3")]))
    assert first.merged_into is None and first.position == 1  # type: ignore[attr-defined]
    assert second.merged_into == "t1" and second.position == 1  # type: ignore[attr-defined]
    assert third.merged_into == "t1"  # type: ignore[attr-defined]
    assert again.duplicate and again.turn_id == "t2"  # type: ignore[attr-defined]
    assert store_client.lrange(proto.keys.inbox(CID), 0, -1) == [b"t0", b"t1"]
    joined = await proto.get_turn(CID, "t1")
    assert joined.merged == ("t2", "t3") and joined.status == "queued"
    kinds = [(type(p).__name__, getattr(p, "text", None)) for p in joined.input.content]
    assert kinds == [
        ("TextPart", "t1"), ("TextPart", "t2"), ("ImagePart", None),
        ("FilePart", None), ("TextPart", "t3"),
    ]  # fmt: skip
    assert joined.input.content[2].data == PNG  # type: ignore[union-attr]
    attached = joined.input.content[3]
    assert isinstance(attached, FilePart) and (attached.data, attached.filename) == (PDF, "a.pdf")
    merged = await proto.get_turn(CID, "t2")
    assert (merged.status, merged.merged_into) == ("merged", "t1")
    assert merged.input == image  # its own message, as submitted
    assert [e["turn_id"] for e in events_of(store_client, proto, "t1", "merged")] == ["t2", "t3"]
    assert events_of(store_client, proto, "t2", "done") == [
        {"status": "merged", "merged_into": "t1"}
    ]


async def test_merge_joins_no_turn_that_started_or_asks_otherwise(proto: TurnProtocol) -> None:
    await running(proto)
    await submit_all(proto, CID, "t1")  # queued without "merge": it answers alone
    assert (await send(proto, "t2", "merge")).merged_into is None  # type: ignore[attr-defined]
    other = await proto.submit(
        CID, "t3", agent="other", message=Message.user("t3"), options={},
        if_busy="merge", merge_key="another agent",
    )  # fmt: skip
    assert other.merged_into is None and other.position == 3
    # The head is running: a merge never joins it, even when it came with "merge".
    assert (await proto.get_turn(CID, "t0")).merged == ()


async def test_an_interrupt_flags_the_running_head_once(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    taken = await running(proto)
    first = await send(proto, "t1", "interrupt")
    assert (first.stopped, first.head, first.position) == ("stopping", "t0", 1)  # type: ignore[attr-defined]
    replay = await send(proto, "t1", "interrupt")
    later = await send(proto, "t2", "interrupt")
    assert replay.duplicate and later.stopped is None  # type: ignore[attr-defined]
    head = await proto.get_turn(CID, "t0")
    assert (head.status, head.stop, head.stopped_by) == ("running", "interrupt", "t1")
    assert events_of(store_client, proto, "t0", "stop_requested") == [
        {"mode": "interrupt", "by": "t1"}
    ]
    # The renewal does not stop it (its step goes on); its next checkpoint does.
    assert not await proto.renew(CID, fence=taken.fence, lease_ms=30_000, turn_id="t0")
    step = TurnState(messages=[taken.turn.input, Message.assistant("half")], steps=1)
    assert await proto.checkpoint(CID, "t0", fence=taken.fence, state=step)


async def test_a_rollback_flags_a_running_head_and_ends_a_queued_one(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    taken = await running(proto)
    stopped = await send(proto, "t1", "rollback")
    assert stopped.stopped == "stopping"  # type: ignore[attr-defined]
    assert await proto.renew(CID, fence=taken.fence, lease_ms=30_000, turn_id="t0")  # cancel
    other = "conv-queued"
    await proto.submit(other, "q0", agent="bot", message=Message.user("q0"), options={})
    ended = await proto.submit(
        other, "q1", agent="bot", message=Message.user("q1"), options={}, if_busy="rollback"
    )
    assert (ended.stopped, ended.head, ended.position) == ("cancelled", "q0", 0)
    record = await proto.get_turn(other, "q0")
    assert record.status == "cancelled" and record.stopped_by == "q1"
    assert record.error is not None and record.error["details"] == {
        "reason": "rolled_back",
        "by": "q1",
    }
    assert store_client.lrange(proto.keys.inbox(other), 0, -1) == [b"q1"]


async def test_on_an_idle_conversation_every_mode_just_queues(proto: TurnProtocol) -> None:
    for n, mode in enumerate(["interrupt", "rollback", "merge"]):
        cid = f"idle-{mode}"
        key = "k" if mode == "merge" else None
        done = await proto.submit(
            cid, f"i{n}", agent="bot", message=Message.user("hi"), options={},
            if_busy=mode, merge_key=key,  # type: ignore[arg-type]
        )  # fmt: skip
        assert (done.position, done.stopped, done.merged_into) == (0, None, None)


async def test_bad_modes_and_a_moved_inbox_write_nothing(
    proto: TurnProtocol, store_client: redis.Redis
) -> None:
    await running(proto)
    before = snapshot(store_client, proto.keys.prefix)
    with pytest.raises(ConvoqError, match="if_busy must be one of"):
        await send(proto, "t1", "later")
    with pytest.raises(ConvoqError, match="merge key"):
        await proto.submit(CID, "t1", agent="bot", message=Message.user("x"), options={},
                           if_busy="merge")  # fmt: skip
    # The script itself refuses a head that is not the one the caller read.
    keys = [proto.keys.meta(CID), proto.keys.inbox(CID), *proto.keys.turn_keys(CID, "t1")]
    keys = [keys[0], keys[1], keys[2], keys[5], proto.keys.lease(CID)]
    keys += proto.keys.turn_keys(CID, "gone")
    raw = Message.user("x").model_dump_json()
    args = ["t1", "bot", raw, "{}", "interrupt", 60_000, 100, 0, '{"status":"queued"}', ""]
    reply = await proto.scripts.run("submit", keys, [*args, "gone", "{}"])
    assert [r.decode() if isinstance(r, bytes) else r for r in reply] == ["MOVED"]
    assert snapshot(store_client, proto.keys.prefix) == before


async def test_a_full_inbox_refuses_an_interrupt_and_the_head_runs_on(
    protocol_url: str, key_prefix: str, store_client: redis.Redis
) -> None:
    limits = QueueLimits(per_conversation=2)
    async with open_protocol(protocol_url, key_prefix, queue_limits=limits) as proto:
        await running(proto)
        await send(proto, "t1", "merge")
        before = snapshot(store_client, proto.keys.prefix)
        with pytest.raises(QueueFullError):
            await send(proto, "t2", "interrupt")
        assert snapshot(store_client, proto.keys.prefix) == before
        # A merge adds no turn: the full inbox takes it.
        assert (await send(proto, "t3", "merge")).merged_into == "t1"  # type: ignore[attr-defined]


async def test_a_merge_under_a_known_idempotency_key_answers_with_the_first(
    proto: TurnProtocol,
) -> None:
    await running(proto)
    await send(proto, "t1", "merge")
    await send(proto, "t2", "merge", idempotency_key="once")
    again = await send(proto, "t9", "merge", idempotency_key="once")
    assert again.duplicate and again.turn_id == "t2"  # type: ignore[attr-defined]
    assert (await proto.get_turn(CID, "t1")).merged == ("t2",)


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[LossyProxy]:
    lossy = LossyProxy(redis_server.port)
    yield lossy
    lossy.close()


async def test_submits_whose_replies_are_lost_merge_and_interrupt_once(
    proxy: LossyProxy, key_prefix: str, redis_client: redis.Redis
) -> None:
    async with open_protocol(proxy.url, key_prefix) as proto:
        await running(proto)
        await send(proto, "t1", "merge")
        proxy.drop_reply_to(b"EVALSHA")  # redis-py sends the script again
        merged = await send(proto, "t2", "merge")
        assert proxy.dropped == 1
        proxy.drop_reply_to(b"EVALSHA")
        stopping = await send(proto, "t3", "interrupt")
        assert proxy.dropped == 2
        assert (await proto.get_turn(CID, "t1")).merged == ("t2",)
        assert merged.turn_id == "t2"  # type: ignore[attr-defined]
        assert stopping.duplicate  # type: ignore[attr-defined]  # the resend found it stored
        assert len(events_of(redis_client, proto, "t0", "stop_requested")) == 1
        assert redis_client.lrange(proto.keys.inbox(CID), 0, -1) == [b"t0", b"t1", b"t3"]


async def test_a_merge_over_the_turn_size_limit_queues_a_turn_of_its_own(
    protocol_url: str, key_prefix: str
) -> None:
    big = Message.user("x" * 600)
    async with open_protocol(protocol_url, key_prefix, max_turn_bytes=1000) as proto:
        await running(proto)
        await send(proto, "t1", "merge", big)
        alone = await send(proto, "t2", "merge", big)  # 1200 bytes together: too many
        assert alone.merged_into is None and alone.position == 2  # type: ignore[attr-defined]
        joined = await send(proto, "t3", "merge")  # small: joins the newest
        assert joined.merged_into == "t2"  # type: ignore[attr-defined]


def test_the_merge_key_is_the_agent_and_every_option_but_the_trace() -> None:
    base = merge_key_of("bot", {"metadata": {"user": "ada"}, "trace": {"x": 1}}, "trace")
    assert base == merge_key_of("bot", {"metadata": {"user": "ada"}}, "trace")
    assert base != merge_key_of("bot", {"metadata": {"user": "bob"}}, "trace")
    assert base != merge_key_of("other", {"metadata": {"user": "ada"}}, "trace")
    assert base != merge_key_of("bot", {"metadata": {"user": "ada"}, "callback_url": "u"})


async def test_a_merge_never_joins_a_retried_turn(proto: TurnProtocol) -> None:
    await send(proto, "t1", "merge")  # idle: queued, and then run
    taken = await proto.acquire(CID, worker_id="w", lease_ms=30_000)
    assert taken is not None
    step = TurnState(messages=[taken.turn.input, Message.assistant("step one")], steps=1)
    await proto.checkpoint(CID, "t1", fence=taken.fence, state=step)
    error = {"type": "ModelError", "message": "down", "details": {}}
    await proto.fail(CID, "t1", error, TurnEnding(fence=taken.fence))
    await proto.retry(CID, "t1", token="r1")  # queued again, its journal kept
    alone = await send(proto, "t2", "merge")
    assert alone.merged_into is None and alone.position == 1  # type: ignore[attr-defined]
    assert (await proto.get_turn(CID, "t1")).merged == ()

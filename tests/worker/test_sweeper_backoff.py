"""The sweeper's backoff, against a real redis-server and the Redis Cluster: a head that
waits with no lease is kicked by the first pass that finds it, then again only once its
hold passed (one interval, doubling up to BACKOFF_CAP intervals); a changed head starts
over; a head a worker took is no candidate and its note goes. The note lives in Redis, so
every sweeping process honours it. A note's hold ends when the key's time to live falls
to its second half: the tests set that time themselves (PEXPIRE, DEL), never racing it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from prometheus_client import REGISTRY

from convoq.messages import Message
from convoq.redis import TurnProtocol
from convoq.redis._sweeping import BACKOFF_CAP, hold_ms
from convoq.worker.sweeper import Sweeper

INTERVAL_S = 60  # long: the note's time to live is far from running out during a test
INTERVAL_MS = INTERVAL_S * 1000


@pytest.fixture
def protocol_url(store_url: str) -> str:
    """On one redis-server and again on the Redis Cluster (the pass pipelines its reads
    across every conversation; SCAN visits every primary)."""
    return store_url


class Recorded:
    """A kick that records the conversations it was sent for."""

    def __init__(self) -> None:
        self.kicked: list[str] = []

    async def __call__(self, cid: str) -> None:
        self.kicked.append(cid)


def sweeper_of(proto: TurnProtocol, kick: Callable[[str], Awaitable[None]]) -> Sweeper:
    return Sweeper(proto, kick, interval_s=INTERVAL_S)


async def submit(proto: TurnProtocol, cid: str, *tids: str) -> None:
    for tid in tids:
        await proto.submit(cid, tid, agent="echo", message=Message.user(tid), options={})


async def note(proto: TurnProtocol, cid: str) -> tuple[str, int]:
    """The sweeper's note of ``cid`` and the milliseconds it has left."""
    value = await proto.redis.get(proto.keys.swept(cid))
    assert value is not None
    return value.decode(), int(await proto.redis.pttl(proto.keys.swept(cid)))


async def end_hold(proto: TurnProtocol, cid: str) -> None:
    """Bring the note to the end of its hold: half its lifetime left (what the clock would
    do in ``hold`` milliseconds)."""
    hold = int((await note(proto, cid))[0].split(" ")[1])
    assert await proto.redis.pexpire(proto.keys.swept(cid), hold)


def held() -> float:
    return REGISTRY.get_sample_value("convoq_sweeper_kicks_held_total") or 0.0


def test_the_hold_doubles_from_one_interval_up_to_the_cap() -> None:
    holds = [hold_ms(kicks, 1000) // 1000 for kicks in range(1, 8)]
    assert holds == [1, 2, 4, 8, 16, 16, 16] and BACKOFF_CAP == 16
    assert hold_ms(10**12, 1000) == 16_000  # a count read from Redis cannot blow it up


async def test_a_waiting_head_is_kicked_once_then_held_back(proto: TurnProtocol) -> None:
    kick = Recorded()
    await submit(proto, "c1", "t1")  # queued, no lease
    sweeper = sweeper_of(proto, kick)

    assert await sweeper.sweep_once() == ["c1"]  # the first pass kicks at once
    value, left = await note(proto, "c1")
    assert value == f"1 {INTERVAL_MS} t1" and INTERVAL_MS < left <= 2 * INTERVAL_MS
    before = held()
    assert await sweeper.sweep_once() == []  # the same head, its hold not passed
    assert held() == before + 1
    assert kick.kicked == ["c1"]


async def test_each_kick_of_the_same_head_holds_twice_as_long_up_to_the_cap(
    proto: TurnProtocol,
) -> None:
    kick = Recorded()
    await submit(proto, "c1", "t1")
    sweeper = sweeper_of(proto, kick)
    assert await sweeper.sweep_once() == ["c1"]
    for kicks in range(2, 8):
        await end_hold(proto, "c1")
        assert await sweeper.sweep_once() == ["c1"]
        hold = INTERVAL_MS * min(2 ** (kicks - 1), BACKOFF_CAP)
        value, left = await note(proto, "c1")
        assert value == f"{kicks} {hold} t1" and hold < left <= 2 * hold
        assert await sweeper.sweep_once() == []
    assert len(kick.kicked) == 7


async def test_a_note_gone_altogether_starts_over(proto: TurnProtocol) -> None:
    await submit(proto, "c1", "t1")
    sweeper = sweeper_of(proto, Recorded())
    assert await sweeper.sweep_once() == ["c1"]
    await end_hold(proto, "c1")
    assert await sweeper.sweep_once() == ["c1"]
    assert (await note(proto, "c1"))[0] == f"2 {2 * INTERVAL_MS} t1"
    await proto.redis.delete(proto.keys.swept("c1"))  # its whole lifetime passed
    assert await sweeper.sweep_once() == ["c1"]
    assert (await note(proto, "c1"))[0] == f"1 {INTERVAL_MS} t1"


async def test_a_changed_head_is_kicked_at_once(proto: TurnProtocol) -> None:
    await submit(proto, "c1", "t1", "t2")
    sweeper = sweeper_of(proto, Recorded())
    assert await sweeper.sweep_once() == ["c1"]
    assert await sweeper.sweep_once() == []
    assert await proto.cancel("c1", "t1") == "cancelled"  # the conversation moved on

    assert await sweeper.sweep_once() == ["c1"]
    assert (await note(proto, "c1"))[0] == f"1 {INTERVAL_MS} t2"


async def test_a_head_a_worker_took_is_no_candidate_and_a_lost_lease_is_kicked_at_once(
    proto: TurnProtocol,
) -> None:
    await submit(proto, "c1", "t1")
    sweeper = sweeper_of(proto, Recorded())
    assert await sweeper.sweep_once() == ["c1"]
    acquired = await proto.acquire("c1", worker_id="w", lease_ms=60_000)
    assert acquired is not None  # the kick arrived

    assert await sweeper.sweep_once() == []
    assert await proto.redis.exists(proto.keys.swept("c1")) == 0  # the note went
    # The worker dies; its lease expires (deleted here, not raced): found at once.
    await proto.redis.delete(proto.keys.lease("c1"))
    assert await sweeper.sweep_once() == ["c1"]


async def test_every_sweeping_process_honours_the_note(proto: TurnProtocol) -> None:
    first, second = Recorded(), Recorded()
    await submit(proto, "c1", "t1")
    assert await sweeper_of(proto, first).sweep_once() == ["c1"]
    assert await sweeper_of(proto, second).sweep_once() == []
    assert await proto.sweep_candidates() == []
    assert second.kicked == []


async def test_a_note_it_cannot_read_holds_nothing_back(proto: TurnProtocol) -> None:
    await submit(proto, "c1", "t1")
    await proto.redis.set(proto.keys.swept("c1"), "not a note", px=600_000)
    sweeper = sweeper_of(proto, Recorded())
    assert await sweeper.sweep_once() == ["c1"]
    assert (await note(proto, "c1"))[0] == f"1 {INTERVAL_MS} t1"


async def test_a_kick_that_raised_is_not_noted(proto: TurnProtocol) -> None:
    refused: list[str] = []

    async def kick(cid: str) -> None:
        refused.append(cid)
        raise ConnectionError("the broker is away")

    await submit(proto, "c1", "t1")
    assert await sweeper_of(proto, kick).sweep_once() == []
    assert refused == ["c1"]
    assert await proto.redis.exists(proto.keys.swept("c1")) == 0
    assert await sweeper_of(proto, Recorded()).sweep_once() == ["c1"]


async def test_many_conversations_on_every_node_in_one_pass(proto: TurnProtocol) -> None:
    cids = [f"many-{n}" for n in range(1200)]  # more than one pipelined batch
    for cid in cids:
        await submit(proto, cid, "t1")
    await submit(proto, "taken", "t1")
    assert await proto.acquire("taken", worker_id="w", lease_ms=60_000) is not None
    kick = Recorded()
    sweeper = sweeper_of(proto, kick)

    assert sorted(await sweeper.sweep_once()) == sorted(cids)
    before = held()
    assert await sweeper.sweep_once() == []
    assert held() == before + len(cids)
    assert len(kick.kicked) == len(set(kick.kicked)) == len(cids)

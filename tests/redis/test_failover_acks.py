"""Acknowledged means durable across a failover: real workers and a client run turns on a
primary with one replica; the primary is killed (SIGKILL) in the middle of the load and
the replica promoted (REPLICAOF NO ONE). Every turn the client was told about (a submit
that returned, a wait that reported it succeeded) must be on the promoted replica when
``min_replicas_acked=1``. With it off the loss is counted and printed, not asserted: it
depends on timing.

To make the window of asynchronous replication visible on loopback (where a replica is
normally microseconds behind), the replication stream is held for a moment before the
primary dies and what it held is dropped with it, as on a congested or partitioned link.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from convoq.client import AsyncClient
from convoq.errors import ConvoqError
from convoq.messages import Message, MessageRole
from convoq.redis import TurnProtocol
from convoq.redis.keys import KeySchema
from convoq.redis.protocol import TurnEnding
from tests.support import services
from tests.support.protocol_helpers import open_protocol
from tests.support.redis_cluster import RedisClusterNodes
from tests.support.redis_server import RedisServer
from tests.support.replicas import Forwarder, ReplicatedPair, promote, wait_links_up
from tests.support.workers import WorkerPool

pytestmark = pytest.mark.slow

ACK_TIMEOUT_MS = 300
CONVERSATIONS = 12
STALL_S = 0.5


@dataclass
class Acknowledged:
    submitted: set[tuple[str, str]] = field(default_factory=set)
    succeeded: set[tuple[str, str]] = field(default_factory=set)
    refused: int = 0  # NotDurableError and friends: not acknowledged, nothing promised


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[ReplicatedPair]:
    servers = ReplicatedPair(tmp_path / "pair")
    servers.start()
    yield servers
    servers.stop()


async def _talk(client: AsyncClient, cid: str, acked: Acknowledged, stop: asyncio.Event) -> None:
    """One conversation's turns, one after another, until ``stop`` or Redis is gone."""
    n = 0
    while not stop.is_set():
        n += 1
        try:
            handle = await client.submit(cid, f"message {n}", agent="echo")
            acked.submitted.add((cid, handle.turn_id))
            result = await handle.wait(timeout=10)
        except (ConvoqError, redis.RedisError, OSError):
            acked.refused += 1
            if stop.is_set():
                return
            await asyncio.sleep(0.05)
            continue
        if result.status == "succeeded":
            acked.succeeded.add((cid, handle.turn_id))


def _lost(replica: RedisServer, prefix: str, acked: Acknowledged) -> tuple[int, int]:
    """Acknowledged submits with no turn record on the promoted replica, and acknowledged
    successes it does not hold as succeeded (the commit stores the turn in history and
    marks it succeeded in one script: one without the other cannot happen)."""
    keys = KeySchema(prefix)
    r = redis.Redis(host="127.0.0.1", port=replica.port)
    try:
        submits = sum(1 for cid, tid in acked.submitted if not r.exists(keys.turn(cid, tid)))
        done = sum(
            1
            for cid, tid in acked.succeeded
            if r.hget(keys.turn(cid, tid), "status") != b"succeeded"
        )
    finally:
        r.close()
    return submits, done


async def _run_and_fail_over(
    pair: ReplicatedPair, pool: WorkerPool, replicas: int
) -> tuple[Acknowledged, tuple[int, int]]:
    acked = Acknowledged()
    stop = asyncio.Event()
    client = AsyncClient(
        pool.redis_url,
        broker_url=pool.env["CONVOQ_BROKER_URL"],
        prefix=pool.prefix,
        partitions=pool.partitions,
        agents=["echo"],
        min_replicas_acked=replicas,
        replica_ack_timeout_ms=ACK_TIMEOUT_MS,
    )
    async with client:
        talkers = [
            asyncio.create_task(_talk(client, f"fo-{i}", acked, stop)) for i in range(CONVERSATIONS)
        ]
        deadline = time.monotonic() + 60
        while len(acked.succeeded) < 3 * CONVERSATIONS and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(acked.succeeded) >= 3 * CONVERSATIONS, pool.logs()
        assert pair.link is not None
        pair.link.hold()  # the replica falls behind while turns go on
        await asyncio.sleep(STALL_S)
        pair.primary.kill()  # SIGKILL, in the middle of commits
        pair.link.close()  # what the link held dies with the primary
        promote(pair.replica)
        # Nothing can be acknowledged from here: the only primary the clients and
        # workers reach is dead. What they were told is now fixed.
        lost = _lost(pair.replica, pool.prefix, acked)
        stop.set()
        for task in talkers:
            task.cancel()
        for task in talkers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 5)
    return acked, lost


@pytest.mark.parametrize("replicas", [1, 0], ids=["acked-by-1-replica", "primary-only"])
def test_killing_the_primary_loses_no_turn_acknowledged_after_replicas_confirmed(
    pair: ReplicatedPair,
    redis_server: RedisServer,
    tmp_path: Path,
    replicas: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    forwarder = Forwarder(pair.primary.port)
    pool = WorkerPool(
        forwarder.url,
        tmp_path / "logs",
        broker_url=redis_server.url,
        min_replicas_acked=replicas,
        replica_ack_timeout_ms=ACK_TIMEOUT_MS,
        concurrency=CONVERSATIONS,
    )
    try:
        pool.start(1)
        acked, (lost_submits, lost_done) = asyncio.run(_run_and_fail_over(pair, pool, replicas))
    finally:
        pool.stop_all()
        forwarder.close()
    with capsys.disabled():
        print(
            f"\nfailover, min_replicas_acked={replicas}: acknowledged submits"
            f" {len(acked.submitted)}, acknowledged successes {len(acked.succeeded)};"
            f" lost after promotion: {lost_submits} submits, {lost_done} successes;"
            f" calls refused or failed (not acknowledged): {acked.refused}"
        )
    if replicas:
        assert (lost_submits, lost_done) == (0, 0)


def _live_owner(nodes: RedisClusterNodes, slot: int) -> int | None:
    """The port of the live primary serving ``slot``, as a live node sees it (None: the
    slot's owner is the killed node still)."""
    live = sorted(nodes.processes)
    node = redis.Redis(host="127.0.0.1", port=live[0])
    try:
        ranges = node.execute_command("CLUSTER SLOTS")
    finally:
        node.close()
    for start, end, primary, *_ in ranges:
        if int(start) <= slot <= int(end) and int(primary[1]) in live:
            return int(primary[1])
    return None


def _wait_replica_confirms(port: int, key: str, timeout_s: float = 30.0) -> None:
    """Until the primary on ``port`` gets a replica's confirmation of a write within the
    test's ack timeout: a replica still on its first sync after the cluster formed does not
    confirm yet, and what the test counts on is failover, not that first sync."""
    node = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            node.set(key, "1")
            if int(node.execute_command("WAIT", 1, ACK_TIMEOUT_MS)) >= 1:
                node.delete(key)
                return
            assert time.monotonic() < deadline, f"no replica of :{port} confirms writes"
    finally:
        node.close()


async def _acked_turn(proto: TurnProtocol, cid: str, tid: str) -> None:
    await proto.submit(cid, tid, agent="bot", message=Message.user(tid), options={})
    acq = await proto.acquire(cid, worker_id="w", lease_ms=10_000)
    assert acq is not None and acq.turn.turn_id == tid
    await proto.commit(
        cid, tid, [Message.user(tid), Message.assistant("ok")], TurnEnding(acq.fence)
    )


async def test_on_a_cluster_acks_resume_on_the_promoted_primary_with_nothing_lost(
    tmp_path: Path, key_prefix: str
) -> None:
    """A primary of a private 3+3 cluster is killed; its replica takes over (cluster
    failover); once the old primary is back as the new one's replica, acknowledged writes
    go on against the slot's new owner, and every turn acknowledged before is there."""
    cli = services.redis_cli()
    nodes = RedisClusterNodes(tmp_path / "cluster", cli)
    nodes.start()
    try:
        wait_links_up(nodes.ports)
        cid = nodes.conversations_on_every_primary(key_prefix, 1)[0]
        slot = key_slot(KeySchema(key_prefix).inbox(cid).encode())
        doomed = nodes.slot_owner(slot)
        _wait_replica_confirms(doomed, KeySchema(key_prefix).base(cid) + ":warm-up")
        async with open_protocol(
            nodes.url, key_prefix, min_replicas_acked=1, replica_ack_timeout_ms=ACK_TIMEOUT_MS
        ) as proto:
            for n in range(5):
                await _acked_turn(proto, cid, f"before-{n}")
            nodes.kill(doomed)
            deadline = time.monotonic() + 60
            while _live_owner(nodes, slot) is None:
                assert time.monotonic() < deadline, "no replica took over"
                await asyncio.sleep(0.2)
            nodes.restart(doomed)  # back as the new primary's replica
            wait_links_up(nodes.ports)
            await _acked_turn(proto, cid, "after")
            history = await proto.history(cid)
        said = [m.text for m in history if m.role == MessageRole.USER]
        assert said == [f"before-{n}" for n in range(5)] + ["after"]
        assert _live_owner(nodes, slot) not in (None, doomed)
    finally:
        nodes.stop()

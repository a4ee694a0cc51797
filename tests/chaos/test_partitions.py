"""Partitions: three workers and a client, each in a network namespace of its own, reach
redis-server (in a hub namespace) over veth links; the links are cut while turns run.

- **Both ways, past the lease**: a worker holding leases is cut for its lease plus 1-4 s
  while the client is cut too; then, while turns run, every worker at once (a full
  partition).
- **One way**: a lease holder's packets to Redis are dropped while Redis's replies still
  arrive, and another worker's the other way, for the lease plus 1-4 s; the client's one
  way, then the other.
- **Flapping**: the link of whichever worker starts a run of the first conversation's
  turn goes down for its lease plus 1.5 s, more times than ``CONVOQ_MAX_ATTEMPTS``, then
  holds. Every turn must succeed: a run cut off from Redis is no crash.

Afterwards what every chaos run checks holds (:mod:`tests.support.chaos_check`): nothing
lost, duplicated, reordered, failed or stuck; one idempotency key per tool call, a tool
run again only where its run was cut off; no key left behind; no worker wedged (each
serves a probe turn on a partition only it consumes); the client saw every turn end. The
recovery time, from the last heal until every turn is final, is printed.

``CONVOQ_HARSH_PARTITIONS=1`` runs the harsh profile instead: more turns, cuts of the
lease plus 1-12 s, the client cut with the workers, more flaps. (No ``tc netem`` on these
kernels: links are dropped, not slowed; see :mod:`tests.support.netns`.)
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from convoq import Client
from convoq.client import TurnHandle
from convoq.redis.keys import KeySchema
from tests.support import netns
from tests.support.chaos_check import (
    Tally,
    leftover_keys,
    on_partitions,
    own_partitions,
    tally,
    wedged_workers,
)
from tests.support.netns import Direction, Host, Lab
from tests.support.partition_lab import HubRedis, NamespacedPool, NamespacedWorker, running_client
from tests.support.workers import wait_until

HARSH = os.environ.get("CONVOQ_HARSH_PARTITIONS", "").strip().lower() in {"1", "true", "yes"}
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600 if HARSH else 120)]

LEASE_S = 2.0
WORKERS, SHARED = 3, 3  # every worker consumes partitions 0-2, and one of its own
SEED = 20261202
FINAL = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class Profile:
    conversations: int
    turns: int
    past_lease_s: tuple[float, float]  # a cut lasts the lease plus this much


PROFILE = Profile(10, 10, (1.0, 12.0)) if HARSH else Profile(6, 8, (1.0, 4.0))


@dataclass
class Deployment:
    """The lab, its Redis, workers and client host; what was cut, and when it healed."""

    lab: Lab
    pool: NamespacedPool
    client: Client  # the test's own, over the link that is never cut
    store: redis.Redis
    client_host: Host
    tool_log: Path
    tmp: Path
    cut_off: set[int] = field(default_factory=set)  # worker pids whose link was cut
    cuts: list[str] = field(default_factory=list)
    last_heal: float = 0.0
    _healers: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def cut_for(self, host: Host, seconds: float, direction: Direction = "both") -> None:
        """Cut ``host``'s link now, heal it ``seconds`` later (in the background)."""
        self.lab.cut(host, direction)
        with self._lock:
            self.cuts.append(f"{host.name} {direction} {seconds:.1f} s")
            self.cut_off.update(w.pid for w in self.workers_on(host))

        def heal() -> None:
            time.sleep(seconds)
            self.lab.heal(host)
            with self._lock:
                self.last_heal = max(self.last_heal, time.monotonic())

        healer = threading.Thread(target=heal, daemon=True)
        healer.start()
        self._healers.append(healer)

    def all_healed(self) -> float:
        """Wait for every cut to heal; the time of the last heal."""
        for healer in self._healers:
            healer.join(60)
        assert not any(h.is_alive() for h in self._healers), "a link was not healed"
        return self.last_heal

    def workers_on(self, host: Host) -> list[NamespacedWorker]:
        return [w for w in self.pool.workers if isinstance(w, NamespacedWorker) and w.host is host]

    def worker_hosts(self) -> list[Host]:
        return [h for h in self.lab.hosts.values() if h is not self.client_host]

    def lease(self, cid: str) -> tuple[str, str]:
        """Holder and fence of ``cid``'s lease ('' when free)."""
        key = KeySchema(self.pool.prefix).lease(cid)
        holder, fence = self.store.hmget(key, ["holder", "fence"])
        return (holder or b"").decode(), (fence or b"").decode()

    def holder_host(self, cids: list[str]) -> Host | None:
        """The host of a worker holding one of ``cids``' leases now, if any."""
        for cid in cids:
            holder = self.lease(cid)[0]
            for worker in self.pool.workers:
                if holder and holder.endswith(f":{worker.pid}") and worker.alive():
                    return getattr(worker, "host", None)
        return None


def conversations(count: int, tag: str) -> list[str]:
    """``count`` conversation ids on the shared partitions (any worker serves them)."""
    return on_partitions(count, tag, range(SHARED), SHARED + WORKERS)


@contextmanager
def deployed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **settings: object
) -> Iterator[Deployment]:
    ip = netns.require()
    netns.sweep_stale(ip)
    tool_log = tmp_path / "tool-runs.log"
    tool_log.touch()
    monkeypatch.setenv("CHAOS_TOOL_LOG", str(tool_log))  # the workers inherit it
    lab = Lab(ip)
    server: HubRedis | None = None
    pool: NamespacedPool | None = None
    try:
        lab.open()
        server = HubRedis(tmp_path / "redis", lab)
        server.start()
        hosts = [lab.host(f"w{k}") for k in range(WORKERS)]
        client_host = lab.host("c0")
        pool = NamespacedPool(
            lab, server.url, tmp_path / "workers",
            agents="tests.support.chaos_agents,tests.support.partition_agents",
            partitions=SHARED + WORKERS, lease_ms=int(LEASE_S * 1000), sweep_interval_s=0.5,
            concurrency=4, shutdown_grace_s=1, **{"max_attempts": 50, **settings},
        )  # fmt: skip
        pool.start_in(hosts, own_partitions(WORKERS, SHARED))
        store = redis.Redis.from_url(server.url)
        with pool.client() as client:
            yield Deployment(lab, pool, client, store, client_host, tool_log, tmp_path)
        store.close()
    finally:
        if pool is not None:
            pool.stop_all()
        if server is not None:
            server.stop()
        lab.close()
        assert not lab.leftovers(), lab.leftovers()


@dataclass
class Submitted:
    """What the client program submitted (filled in as it acknowledges turns), and it."""

    cids: list[str]
    turns: int
    out: Path
    process: subprocess.Popen[bytes]
    handles: dict[str, list[TurnHandle]]

    def lines(self) -> list[dict[str, Any]]:
        text = self.out.read_text() if self.out.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    def read(self, client: Client) -> int:
        """Take up the turns it acknowledged since; how many so far."""
        acked = [x for x in self.lines() if "cid" in x]
        for line in acked[sum(map(len, self.handles.values())) :]:
            self.handles[line["cid"]].append(client.handle(line["cid"], line["tid"]))
        return len(acked)

    def log(self) -> str:
        return self.out.with_suffix(".log").read_text(errors="replace")[-3000:]


@contextmanager
def submitting(
    d: Deployment, cids: list[str], turns: int, agent: str = "effect"
) -> Iterator[Submitted]:
    """The client program submitting ``turns`` rounds to ``cids``, 0.8 s apart."""
    plan = {"conversations": cids, "turns": turns, "agent": agent, "round_pause_s": 0.8,
            "submit_s": 90, "wait_s": 150}  # fmt: skip
    out = d.tmp / "client.jsonl"
    with running_client(d.lab, d.client_host, d.pool, plan, out) as process:
        yield Submitted(cids, turns, out, process, {cid: [] for cid in cids})


def _until_final(handles: dict[str, list[TurnHandle]], timeout: float) -> float:
    """When every turn was final (monotonic), polled over the link never cut."""
    pending = [h for hs in handles.values() for h in hs]
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        pending = [h for h in pending if h.status() not in FINAL]
        if pending:
            time.sleep(0.05)
    return time.monotonic()


def check(d: Deployment, run: Submitted) -> Tally:
    """Once the chaos is over: every invariant of a chaos run, the recovery time printed."""
    total = len(run.cids) * run.turns
    wait_until(lambda: run.read(d.client) == total or run.process.poll() is not None, 120,
               what="the client to submit every turn")  # fmt: skip
    assert run.read(d.client) == total, run.log()
    healed = d.all_healed()
    pending = sum(h.status() not in FINAL for hs in run.handles.values() for h in hs)
    final_at = _until_final(run.handles, 120)
    expected = {cid: [f"{cid} t{t}" for t in range(run.turns)] for cid in run.cids}
    found = tally(d.client, run.handles, expected, d.tool_log, wait_s=10)
    left = leftover_keys(d.store, d.pool.prefix, run.cids)
    wedged = wedged_workers(d.client, d.pool.workers, SHARED)
    run.process.wait(60)
    client_saw = [x for x in run.lines() if "final" in x]
    unseen = [x for x in client_saw if x["status"] != "succeeded"]
    print(
        f"\npartitions: {found.turns} turns, {WORKERS} workers and a client in namespaces,"
        f" lease {LEASE_S:g} s; cuts: {', '.join(d.cuts)}; {pending} turns not final at the"
        f" last heal, all final {max(0.0, final_at - healed):.1f} s after it (recovery);"
        f" {found.summary()};"
        f" leftover keys {len(left)}, wedged workers {len(wedged)}"
    )
    found.assert_held(d.cut_off)
    assert not left, left
    assert not wedged, (wedged, d.pool.logs())
    assert run.process.returncode == 0, run.log()
    assert len(client_saw) == found.turns and not unseen, unseen
    return found


def test_links_cut_both_ways_past_the_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(SEED)
    past = lambda: LEASE_S + rng.uniform(*PROFILE.past_lease_s)  # noqa: E731
    cids = conversations(PROFILE.conversations, "cut")
    with deployed(tmp_path, monkeypatch) as d, submitting(d, cids, PROFILE.turns) as run:
        victim = wait_until(lambda: d.holder_host(cids), 60, 0.02, what="a lease holder")
        d.cut_for(victim, past())
        d.cut_for(d.client_host, rng.uniform(1.0, 3.0))
        d.all_healed()
        # Then a full partition while turns run: every worker (and in the harsh profile
        # the client) cut at once, for one duration.
        wait_until(lambda: d.holder_host(cids), 60, 0.02, what="a turn running")
        down = past()
        for host in [*d.worker_hosts(), *([d.client_host] if HARSH else [])]:
            d.cut_for(host, down)
        check(d, run)


def test_links_cut_one_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(SEED + 1)
    past = lambda: LEASE_S + rng.uniform(*PROFILE.past_lease_s)  # noqa: E731
    cids = conversations(PROFILE.conversations, "oneway")
    with deployed(tmp_path, monkeypatch) as d, submitting(d, cids, PROFILE.turns) as run:
        # Two workers at once, one each way (a lease holder first), then the client
        # each way in turn.
        first = wait_until(lambda: d.holder_host(cids), 60, 0.02, what="a lease holder")
        second = next(h for h in d.worker_hosts() if h is not first)
        d.cut_for(first, past(), "to_hub")
        d.cut_for(second, past(), "from_hub")
        for direction in ("to_hub", "from_hub"):
            d.cut_for(d.client_host, rng.uniform(1.0, 3.0), direction)
            wait_until(lambda: d.client_host.cut is None, 30, what="the client's link healed")
        check(d, run)


FLAPS, FLAP_ATTEMPTS = 8 if HARSH else 5, 3  # more flaps than the turn's attempts


def test_a_flapping_link_then_holding_fails_no_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cids = conversations(3, "flap")
    with deployed(tmp_path, monkeypatch, max_attempts=FLAP_ATTEMPTS) as d, submitting(
        d, cids, 2, agent="slow_effect"
    ) as run:  # fmt: skip
        inbox = KeySchema(d.pool.prefix).inbox(cids[0])
        target, flapped, fence_seen = "", 0, ""
        deadline = time.monotonic() + 90
        while flapped < FLAPS and time.monotonic() < deadline:
            fence = d.lease(cids[0])[1]
            host = d.holder_host([cids[0]]) if fence and fence != fence_seen else None
            if host is not None and host.cut is None:  # a run of the first turn just started
                fence_seen = fence
                target = target or (d.store.lindex(inbox, 0) or b"").decode()
                if (d.store.lindex(inbox, 0) or b"").decode() != target:
                    break  # the turn ended (failed, when cut-offs count as crashes)
                d.cut_for(host, LEASE_S + 1.5)
                flapped += 1
            time.sleep(0.02)
        print(f"\nflapping: {flapped} runs of one turn cut, CONVOQ_MAX_ATTEMPTS={FLAP_ATTEMPTS}")
        check(d, run)
        assert flapped == FLAPS, f"{flapped} runs of {target} cut in 90 s, not {FLAPS}"

"""What every chaos run checks once the chaos is over, whatever broke: each conversation's
turns against what the client submitted, the side effects their tools left, the keys left
behind and the workers still serving (:func:`wedged_workers`: each worker also consumes a
partition of its own, :func:`own_partitions`, where it is sent a probe turn).

Turns run the ``effect`` profile of :mod:`tests.support.chaos_agents` (a tool records
one line per execution with its idempotency key in ``CHAOS_TOOL_LOG``, then the model
echoes every user text seen). :func:`tally` counts; :meth:`Tally.assert_held` says what
must hold: nothing lost, duplicated, reordered, failed or stuck; one idempotency key per
tool call and one call per turn; a tool run again only where the run that ran it was cut
off (its worker killed, paused, or cut from Redis).
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

from convoq import Client
from convoq.client import TurnHandle, TurnResult
from convoq.errors import TurnTimeoutError
from convoq.messages import MessageRole
from convoq.queue.routing import partition_of
from convoq.redis.keys import KeySchema
from tests.support.workers import WorkerProcess


@dataclass
class Tally:
    """What a chaos run left, counted."""

    turns: int = 0
    failed: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    stuck: int = 0  # not final when the wait ran out
    wrong_answers: int = 0  # a last turn that did not see every turn before it, in order
    rerun_turns: int = 0  # turns run more than once (attempts > 1)
    runs: dict[str, list[int]] = field(default_factory=dict)  # text -> pids that ran its tool
    keys: dict[str, set[str]] = field(default_factory=dict)  # text -> idempotency keys seen
    errors: list[str] = field(default_factory=list)  # the failed turns' errors

    @property
    def tool_runs(self) -> int:
        return sum(map(len, self.runs.values()))

    @property
    def reran(self) -> dict[str, list[int]]:
        """The turns whose tool ran more than once, with the processes that ran it."""
        return {text: pids for text, pids in self.runs.items() if len(pids) > 1}

    def invariants(self) -> dict[str, int]:
        """Each invariant and how many times it broke (all 0 when it held)."""
        keys_per_call = sum(len(found) > 1 for found in self.keys.values())
        distinct = len(set().union(*self.keys.values()))
        return {
            "lost": self.lost, "duplicated": self.duplicated, "reordered": self.reordered,
            "failed": self.failed, "stuck": self.stuck, "wrong answers": self.wrong_answers,
            "tool calls never run": self.turns - len(self.runs),
            "tool calls with more than one key": keys_per_call,
            "distinct keys unlike tool calls": abs(self.turns - distinct),
        }  # fmt: skip

    def summary(self) -> str:
        return (
            f"lost {self.lost}, duplicated {self.duplicated}, reordered {self.reordered},"
            f" failed {self.failed}, stuck {self.stuck}; turns run more than once"
            f" {self.rerun_turns}; tool executions {self.tool_runs}, turns whose tool ran"
            f" twice {len(self.reran)} ({len(self.reran) / max(self.turns, 1):.1%})"
        )

    def assert_held(self, cut_off: set[int]) -> None:
        """Every invariant held; a tool ran again only where a run was cut off: at most
        one of a turn's executions is in a process never cut off. (Log order is not start
        order: a paused or cut-off worker finishes its call when it comes back.)"""
        broken = {name: n for name, n in self.invariants().items() if n}
        assert not broken, (broken, self.errors[:5])
        for text, pids in self.reran.items():
            assert len([p for p in pids if p not in cut_off]) <= 1, (text, pids, cut_off)


def tally(
    client: Client,
    handles: dict[str, list[TurnHandle]],
    expected: dict[str, list[str]],
    tool_log: Path,
    *,
    wait_s: float = 120,
) -> Tally:
    """Count what the run left: ``handles[cid]`` are the turns submitted to ``cid`` whose
    user texts were ``expected[cid]``, in order; each is waited for until ``wait_s`` has
    passed since the call (then it counts as stuck)."""
    found = Tally(turns=sum(map(len, expected.values())))
    deadline = time.monotonic() + wait_s
    for cid, texts in expected.items():
        results = [_wait(h, deadline) for h in handles.get(cid, [])]
        found.stuck += sum(r is None for r in results) + len(texts) - len(results)
        done = [r for r in results if r is not None]
        found.failed += sum(r.status != "succeeded" for r in done)
        found.errors += [f"{r.turn_id}: {r.error}" for r in done if r.status != "succeeded"]
        found.rerun_turns += sum(r.attempts > 1 for r in done)
        users = [m.text for m in client.history(cid) if m.role == MessageRole.USER]
        found.lost += len(set(texts) - set(users))
        found.duplicated += len(users) - len(set(users))
        found.reordered += int(users != texts and sorted(set(users)) == sorted(texts))
        last = done[-1].text if done and len(done) == len(texts) else None
        found.wrong_answers += int(last != "seen: " + " | ".join(texts))
    runs: dict[str, list[int]] = collections.defaultdict(list)
    keys: dict[str, set[str]] = collections.defaultdict(set)
    for line in tool_log.read_text().splitlines():
        text, pid, key = line.split("\t")
        runs[text].append(int(pid))
        keys[text].add(key)
    found.runs, found.keys = dict(runs), dict(keys)
    return found


def _wait(handle: TurnHandle, deadline: float) -> TurnResult | None:
    try:
        return handle.wait(max(0.1, deadline - time.monotonic()), raise_on_error=False)
    except TurnTimeoutError:
        return None


def leftover_keys(store: redis.Redis, prefix: str, conversations: list[str]) -> list[str]:
    """Keys that must be gone once every turn of ``conversations`` is final: an inbox, a
    held lease, a step journal or a continuation that never expires, an admitted turn."""
    keys = KeySchema(prefix)
    left = []
    for cid in conversations:
        for key in store.scan_iter(match=keys.conversation_pattern(cid), count=1000):
            name = key.decode()
            kind = name.removeprefix(keys.base(cid) + ":").split(":")[0]
            if kind == "inbox" or (kind in ("journal", "cont") and store.pttl(key) == -1):
                left.append(name)
            elif kind == "lease" and store.hget(key, "holder"):
                left.append(f"{name} (held by {store.hget(key, 'holder')!r})")
    members = keys.queue_keys()[0]
    for entry in store.hkeys(members):
        cid = entry.decode().rsplit(" ", 1)[0]
        if cid in conversations:
            left.append(f"{members} {entry.decode()}")
    return left


def own_partitions(workers: int, shared: int) -> list[str]:
    """Each worker's ``--partitions``: the ``shared`` ones all consume (``0..shared-1``),
    and one of its own (``shared + k``), where nothing but its probe goes."""
    return [f"0-{shared - 1},{shared + k}" for k in range(workers)]


def on_partitions(count: int, tag: str, wanted: range, partitions: int) -> list[str]:
    """``count`` conversation ids (``{tag}-{n}``) whose partition is in ``wanted``."""
    ids = (f"{tag}-{n}" for n in itertools.count())
    return list(itertools.islice((c for c in ids if partition_of(c, partitions) in wanted), count))


def wedged_workers(
    client: Client, workers: Sequence[WorkerProcess], shared: int, wait_s: float = 60
) -> list[str]:
    """The workers (started with :func:`own_partitions`, in that order, running the
    ``whoami`` profile of :mod:`tests.support.chaos_agents`) that do not answer a probe
    turn on their own partition: alive or not, they no longer serve their queue."""
    partitions = shared + len(workers)
    wedged = []
    for k, worker in enumerate(workers):
        [cid] = on_partitions(1, f"probe-{k}", range(shared + k, shared + k + 1), partitions)
        result = client.submit(cid, "who?", agent="whoami").wait(wait_s, raise_on_error=False)
        if result.text != f"served by {worker.pid}":
            wedged.append(f"{worker.name}: {result.status} {result.text!r}")
    return wedged

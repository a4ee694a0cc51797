"""The client side of each queued system of :mod:`bench.compare_runs`, built in a process
of its own (:mod:`bench._procs`): its submitters and waiters share neither a heap, a
garbage collector nor a GIL with another system's.

Each side runs turns one at a time (``turns``: per-turn ms) and bursts (``burst``: the
same 50 submitter threads, each running one conversation of 4 turns, its turns submitted
then awaited; seconds for all of them). A conversation id of None is a new conversation;
a given one holds stored turns."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from celery import chain

from bench import peers

CONVERSATIONS, TURNS_EACH = 50, 4
# convoq's agent (bench.compare) for each kind of zero-latency model; the peers call a
# plain function in every case, so "sync" is their "ok".
AGENTS = {"ok": "zero", "300": "zero300", "sync": "zerosync"}


def new_id() -> str:
    return f"c-{uuid.uuid4().hex[:12]}"


class _Side:
    """What every side shares: the timing of turns, the burst pool."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(CONVERSATIONS)

    def turn(self, cid: str, kind: str) -> None:
        raise NotImplementedError

    def conversation(self, cid: str | None, kind: str) -> None:
        raise NotImplementedError

    def turns(self, kind: str, cids: Sequence[str | None]) -> list[float]:
        samples = []
        for cid in cids:
            started = time.perf_counter()
            self.turn(cid or new_id(), kind)
            samples.append((time.perf_counter() - started) * 1000)
        return samples

    def burst(self, kind: str, cids: Sequence[str | None]) -> float:
        started = time.perf_counter()
        for done in [self.pool.submit(self.conversation, cid, kind) for cid in cids]:
            done.result(timeout=300)
        return time.perf_counter() - started

    def close(self) -> None:
        self.pool.shutdown()


class ConvoqSide(_Side):
    """A convoq Client on ``url`` (``mode``: the fast paths on or off)."""

    def __init__(self, url: str, prefix: str, home: str, mode: str) -> None:
        super().__init__()
        os.environ["CONVOQ_FAST_PATHS"] = mode
        from convoq.client import Client
        from convoq.settings import ConvoqSettings

        settings = ConvoqSettings.resolve(
            redis_url=url, prefix=prefix, home=Path(home), fast_paths=mode == "on"
        )
        self.client = Client(settings=settings)

    def turn(self, cid: str, kind: str) -> None:
        self.client.submit(cid, "hi", agent=AGENTS[kind]).wait(30)

    def conversation(self, cid: str | None, kind: str) -> None:
        cid = cid or new_id()
        handles = [
            self.client.submit(cid, f"turn {i}", agent=AGENTS[kind]) for i in range(TURNS_EACH)
        ]
        for handle in handles:
            handle.wait(120)

    def close(self) -> None:
        super().close()
        self.client.close()


def _reply(kind: str) -> str:
    return "300" if kind == "300" else "ok"


class BareSide(_Side):
    """A bare Celery task with a Redis result backend, awaited with ``.get()``."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.app = peers.make_app(url)

    def turn(self, cid: str, kind: str) -> None:
        self.app.send_task("bench.bare", args=["hi", _reply(kind)]).get(timeout=30)

    def conversation(self, cid: str | None, kind: str) -> None:
        results = [
            self.app.send_task("bench.bare", args=["hi", _reply(kind)]) for _ in range(TURNS_EACH)
        ]
        for result in results:
            result.get(timeout=120)


class HandSide(_Side):
    """The hand-built task (RedisSession last 10 turns + model + ``add_items``); its
    burst runs one turn in each of 4 conversations (no order to keep), or with
    ``ordered`` a Celery chain per conversation (each turn starts when the one before
    ended: the order convoq keeps)."""

    def __init__(self, url: str, ordered: bool) -> None:
        super().__init__()
        self.app = peers.make_app(url)
        self.ordered = ordered

    def turn(self, cid: str, kind: str) -> None:
        self.app.send_task("bench.handbuilt", args=[cid, "hi", _reply(kind)]).get(timeout=30)

    def conversation(self, cid: str | None, kind: str) -> None:
        reply = _reply(kind)
        if self.ordered:
            cid = cid or new_id()
            steps = [self.app.signature("bench.handbuilt", args=[cid, f"turn {i}", reply],
                                        immutable=True) for i in range(TURNS_EACH)]  # fmt: skip
            chain(*steps).apply_async().get(timeout=120)
            return
        # One turn in each of 4 conversations: ``cid`` names the first of 4 stored ones
        # ("<cid>/0" .. "<cid>/3"), or none.
        ids = [f"{cid}/{i}" if cid else new_id() for i in range(TURNS_EACH)]
        results = [self.app.send_task("bench.handbuilt", args=[c, "hi", reply]) for c in ids]
        for result in results:
            result.get(timeout=120)

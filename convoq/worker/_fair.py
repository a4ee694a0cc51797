"""Fair slots: a drain gives its slot up after a turn while other conversations wait.

A drain runs one conversation's turns back to back, one Redis round trip per turn. That
is the fastest path for a lone busy conversation, but while every slot of the process is
held that way, kicks of other conversations wait for whole conversations to finish. So
after each turn the runner asks :meth:`Fairness.others_waiting`; when they do, its commit
keeps the lease for the next turn without taking it, and :meth:`Fairness.requeue` sends
the conversation back in line with the lease's fence as proof (the drain that picks it up
takes the kept lease). The slot then runs the kick that waited longest.

"Others wait" means: every slot of this process runs a drain, and the queues this process
consumes hold kicks (counted through the broker, at most once per ``refresh_s``, and only
while all slots are busy, so an idle or half-busy worker never asks the broker).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from celery.worker import state

log = logging.getLogger("convoq.worker")


class Fairness(Protocol):
    """What the runner asks after each turn, and how it sends a conversation back in line."""

    async def others_waiting(self) -> bool: ...

    async def requeue(self, conversation_id: str, head: str, fence: int) -> None: ...


class NeverYield:
    """Keep every conversation to the end of its inbox (tests, in-process runners)."""

    async def others_waiting(self) -> bool:
        return False

    async def requeue(self, conversation_id: str, head: str, fence: int) -> None:
        raise RuntimeError("NeverYield never requeues")


class SlotBacklog:
    """Fairness for one worker process (see the module docstring).

    Args:
        slots: drains the process runs at once (its pool's concurrency).
        queued_kicks: counts the kicks waiting in the queues this process consumes
            (blocking; run in a thread).
        send: sends ``drain(cid)`` with the head and fence hints (blocking).
        refresh_s: how long a count is trusted.
    """

    def __init__(
        self,
        slots: int,
        queued_kicks: Callable[[], int],
        send: Callable[[str, str, int], None],
        *,
        refresh_s: float = 0.05,
    ) -> None:
        self._slots = slots
        self._count = queued_kicks
        self._send = send
        self._refresh_s = refresh_s
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._probe_lock: asyncio.Lock | None = None
        self._waiting = False
        self._fresh_until = 0.0

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Around each drain: the slot it holds counts as busy."""
        with self._busy_lock:
            self._busy += 1
        try:
            yield
        finally:
            with self._busy_lock:
                self._busy -= 1

    async def others_waiting(self) -> bool:
        if self._busy < self._slots:
            return False  # a free slot takes any waiting kick anyway
        if self._probe_lock is None:
            self._probe_lock = asyncio.Lock()
        async with self._probe_lock:  # one count in flight; the others use its answer
            if time.monotonic() >= self._fresh_until:
                try:
                    self._waiting = _reserved_here() or await asyncio.to_thread(self._count) > 0
                except Exception as exc:  # no count: keep the fast path
                    log.warning("could not count the kicks waiting: %s", exc)
                    self._waiting = False
                self._fresh_until = time.monotonic() + self._refresh_s
            return self._waiting

    async def requeue(self, conversation_id: str, head: str, fence: int) -> None:
        await asyncio.to_thread(self._send, conversation_id, head, fence)


def _reserved_here() -> bool:
    """Whether this process holds kicks it received but has not started (a prefetch
    multiplier above 1): they wait for a slot as much as those in the broker."""
    return len(state.reserved_requests) > len(state.active_requests)

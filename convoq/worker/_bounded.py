"""Waiting with a bound for work that may not stop: a library (redis-py's asyncio client in
some paths) can swallow a ``CancelledError``, so whoever cancels never waits for the
cancellation to land without a limit; what does not stop is logged and left."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger("convoq.worker")
T = TypeVar("T")


async def stop_bounded(tasks: list[asyncio.Future[Any]], wait_s: float, what: str) -> None:
    """Cancel ``tasks`` and wait for them at most ``wait_s``; what is still running is
    logged and left (never awaited without a bound: a library may swallow the cancel)."""
    pending = [t for t in tasks if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=wait_s)
    for t in tasks:
        if not t.done():
            log.error(
                "%s: a task did not stop within %.1fs of its cancellation; left", what, wait_s
            )
        t.add_done_callback(retrieve)


def retrieve(task: asyncio.Future[Any]) -> None:
    """Collect the outcome of a task nobody awaits (no 'exception never retrieved')."""
    if not task.cancelled():
        task.exception()


async def bounded(coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """``coro``'s result, or TimeoutError after ``timeout_s`` (the call is cancelled and
    left: unlike ``asyncio.wait_for``, this never waits for a cancellation to land)."""
    task = asyncio.ensure_future(coro)
    try:
        await asyncio.wait([task], timeout=timeout_s)
    finally:
        answered_in_time = task.done()
        if not answered_in_time:  # timed out, or the caller itself was cancelled
            task.cancel()
            task.add_done_callback(retrieve)
    if not answered_in_time:
        raise TimeoutError(f"no answer within {timeout_s:.1f}s")
    return task.result()

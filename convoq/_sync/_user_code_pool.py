"""One process-wide thread pool for blocking user code: sync model functions and tools
(see :mod:`convoq._sync`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from convoq.errors import ConfigurationError

T = TypeVar("T")

# Sync model functions and tools that may run at once in a process without a worker (as
# many as a worker runs turns by default). Threads start only when needed.
DEFAULT_BLOCKING_THREADS = 32

_blocking_lock = threading.Lock()
_blocking: concurrent.futures.ThreadPoolExecutor | None = None
_blocking_threads = DEFAULT_BLOCKING_THREADS


def set_blocking_threads(count: int) -> None:
    """Set how many sync model functions and sync tools may run at once in this process.

    They run on a thread pool of their own, not on asyncio's default executor (capped at
    ``min(32, CPUs + 4)`` threads). A worker sizes it to ``CONVOQ_CONCURRENCY``; elsewhere
    it holds 32 threads, started only when needed. Calls already running finish on the old
    pool; later ones use the new size.

    Args:
        count: threads in the pool, at least 1.

    Raises:
        ConfigurationError: ``count`` is not a positive int.
    """
    global _blocking, _blocking_threads
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigurationError(f"blocking threads must be a positive int, not {count!r}")
    with _blocking_lock:
        old, _blocking, _blocking_threads = _blocking, None, count
    if old is not None:
        old.shutdown(wait=False)


def blocking_threads() -> int:
    """The current size of the pool for blocking user code."""
    return _blocking_threads


def _submit_blocking(call: Callable[[], T]) -> concurrent.futures.Future[T]:
    global _blocking
    while True:
        with _blocking_lock:
            if _blocking is None:
                _blocking = concurrent.futures.ThreadPoolExecutor(
                    _blocking_threads, thread_name_prefix="convoq-blocking"
                )
            pool = _blocking
        try:
            return pool.submit(call)
        except RuntimeError:
            if pool is _blocking:  # the interpreter is shutting down, not a resize
                raise


async def run_blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run blocking ``fn`` on the pool for user code, in the caller's context."""
    context = contextvars.copy_context()
    call = functools.partial(context.run, fn, *args, **kwargs)
    return await asyncio.wrap_future(_submit_blocking(call))


async def call_maybe_async(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Await ``fn`` if it is async; otherwise run it on the pool for blocking user code.

    A blocking sync function (a tool, a scripted model) then holds up only its own turn.
    """
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    result = await run_blocking(fn, *args, **kwargs)
    if isinstance(result, Awaitable):  # a sync callable that returned a coroutine
        return await result
    return result


def _after_fork_in_child() -> None:
    global _blocking, _blocking_lock
    _blocking_lock = threading.Lock()
    _blocking = None  # its threads stayed in the parent


os.register_at_fork(after_in_child=_after_fork_in_child)

"""The one bridge between sync and async.

- :mod:`convoq._sync._loop`: a long-lived event loop on a daemon thread. Sync APIs
  (``Agent.generate``, ``Client``, ``ConversationMemory.load``...) submit their coroutine
  there instead of calling ``asyncio.run`` each time, so connection pools (httpx, redis)
  created by the coroutine outlive the call, and sync APIs work from inside a running
  event loop too. Celery worker processes use the same kind of loop for their tasks. A
  sync call that is interrupted (Ctrl-C) or times out cancels its coroutine and waits, for
  at most :data:`CANCEL_GRACE_S`, until the coroutine has cleaned up: a turn interrupted
  this way stores nothing. The wait is bounded and the cancel repeated, because a library
  may swallow a ``CancelledError``. A forked child gets fresh loops (the parent's threads
  do not exist in it); loops are stopped at interpreter exit.
- :mod:`convoq._sync._user_code_pool`: blocking user code (sync model functions and tools) runs
  on one process-wide thread pool sized by :func:`set_blocking_threads` (a worker sizes it
  to its concurrency), not on asyncio's default executor, which caps at
  ``min(32, CPUs + 4)`` threads.
- :mod:`convoq._sync._steps`: logic written once as sans-I/O steps, driven by a sync or an
  async performer (:func:`drive`, :func:`adrive`), so a sync path can do its I/O on the
  caller's thread without a second implementation.
"""

from convoq._sync._loop import (
    CANCEL_GRACE_S,
    LoopThread,
    iterate_sync,
    left_in_parent,
    run_in_portal,
    run_sync,
)
from convoq._sync._steps import adrive, drive
from convoq._sync._user_code_pool import (
    DEFAULT_BLOCKING_THREADS,
    blocking_threads,
    call_maybe_async,
    run_blocking,
    set_blocking_threads,
)

__all__ = [
    "CANCEL_GRACE_S",
    "DEFAULT_BLOCKING_THREADS",
    "LoopThread",
    "adrive",
    "blocking_threads",
    "call_maybe_async",
    "drive",
    "iterate_sync",
    "left_in_parent",
    "run_blocking",
    "run_in_portal",
    "run_sync",
    "set_blocking_threads",
]

"""A long-lived event loop on a daemon thread, and the shared one sync APIs use (see
:mod:`convoq._sync`)."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger("convoq")

# How long an interrupted or timed-out sync call waits for its coroutine's cleanup.
CANCEL_GRACE_S = 5.0
_RECANCEL_S = 0.1  # a swallowed cancel is repeated this often while we wait
_START_TIMEOUT_S = 30.0


class _Call(Generic[T]):
    """A coroutine run as a task on a loop, cancellable from any thread; ``done``
    settles only once the task has really ended (its cleanup included)."""

    def __init__(self, coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> None:
        self.done: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._loop = loop
        self._task: asyncio.Task[T] | None = None
        try:
            loop.call_soon_threadsafe(self._start, coro)
        except RuntimeError:  # the loop was closed meanwhile
            coro.close()
            raise

    def _start(self, coro: Coroutine[Any, Any, T]) -> None:
        self._task = self._loop.create_task(coro)
        self._task.add_done_callback(self._settle)

    def _settle(self, task: asyncio.Task[T]) -> None:
        if task.cancelled():
            self.done.cancel()
            return
        exc = task.exception()  # retrieved even when nobody waits any more
        if self.done.done():  # a waiter's loop gave up on it
            return
        if exc is not None:
            self.done.set_exception(exc)
        else:
            self.done.set_result(task.result())

    def cancel(self) -> None:
        """Ask the loop to cancel the task (the request runs after ``_start``)."""
        with contextlib.suppress(RuntimeError):  # a closed loop runs nothing any more
            self._loop.call_soon_threadsafe(self._cancel_task)

    def _cancel_task(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def stop(self, grace_s: float) -> None:
        """Cancel and wait up to ``grace_s`` for the task to end (from a sync caller)."""
        deadline = time.monotonic() + grace_s
        while not self.done.done() and (left := deadline - time.monotonic()) > 0:
            self.cancel()
            concurrent.futures.wait([self.done], timeout=min(_RECANCEL_S, left))
        self._report(grace_s)

    async def astop(self, waiter: asyncio.Future[T], grace_s: float) -> None:
        """:meth:`stop` for a caller on another event loop."""
        deadline = time.monotonic() + grace_s
        while not waiter.done() and (left := deadline - time.monotonic()) > 0:
            self.cancel()
            await asyncio.wait([waiter], timeout=min(_RECANCEL_S, left))
        if waiter.done() and not waiter.cancelled():
            waiter.exception()  # retrieved: it is not news any more
        self._report(grace_s)

    def _report(self, grace_s: float) -> None:
        if not self.done.done():
            log.warning(
                "a cancelled convoq call did not finish within %.1f s; it may still run", grace_s
            )


class LoopThread:
    """An event loop running forever on its own daemon thread.

    Args:
        name: the thread's name.
        cancel_grace_s: how long an interrupted call waits for its coroutine to clean up.
    """

    def __init__(self, name: str = "convoq-loop", *, cancel_grace_s: float = CANCEL_GRACE_S):
        self._name = name
        self.cancel_grace_s = cancel_grace_s
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        _loop_threads.add(self)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                self._loop, self._thread = self._start()
            return self._loop

    def _start(self) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        thread = threading.Thread(target=run, name=self._name, daemon=True)
        thread.start()
        if not ready.wait(_START_TIMEOUT_S):
            raise RuntimeError(f"convoq's loop thread {self._name} did not start")
        return loop, thread

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop thread and block until it returns or raises.

        Interrupted (KeyboardInterrupt) or past ``timeout`` (TimeoutError), the coroutine
        is cancelled and its cleanup awaited (bounded by ``cancel_grace_s``) before the
        exception reaches the caller.
        """
        loop = self.loop
        if _running_loop() is loop:
            coro.close()
            raise RuntimeError("a sync convoq API was called from its own loop thread; await it")
        call = _Call(coro, loop)
        try:
            return call.done.result(timeout)
        except BaseException:
            call.stop(self.cancel_grace_s)
            raise

    async def run_from_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on this loop from any other loop; cancelling the caller
        cancels ``coro`` and waits (bounded) for its cleanup."""
        loop = self.loop
        if _running_loop() is loop:
            return await coro
        call = _Call(coro, loop)
        waiter = asyncio.wrap_future(call.done)
        try:
            return await asyncio.shield(waiter)
        except asyncio.CancelledError:
            await call.astop(waiter, self.cancel_grace_s)
            raise

    def iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        """Drive an async iterator from sync code, one item at a time.

        Leaving the loop early closes an async generator at once (its ``finally`` runs on
        the loop before this returns), not whenever it is garbage-collected.
        """
        try:
            while True:
                try:
                    item = self.run(_anext(agen))
                except StopAsyncIteration:
                    return
                yield item
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None:
                try:
                    self.run(aclose(), timeout=self.cancel_grace_s)
                except (RuntimeError, TimeoutError):  # it swallowed the interrupt
                    log.warning("an interrupted convoq stream could not be closed")

    def stop(self, timeout: float = 2.0) -> None:
        """Cancel what still runs on the loop, wait (bounded), stop and close it."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None or loop.is_closed() or not thread.is_alive():
            return
        if thread is threading.current_thread():
            raise RuntimeError("a convoq loop cannot stop itself")
        finished = asyncio.run_coroutine_threadsafe(_cancel_all(timeout), loop)
        try:
            finished.result(timeout + 1)
        except Exception as exc:  # stopping anyway
            log.warning("convoq loop %s did not wind down cleanly: %r", self._name, exc)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if not thread.is_alive():
            loop.close()

    def _after_fork_in_child(self) -> None:
        # The parent's loop thread does not exist here. The loop is kept referenced, never
        # closed: it counts as running (for a thread that is gone) and owns parent's fds.
        if self._loop is not None:
            _orphans.append(self._loop)
        self._lock = threading.Lock()
        self._loop = self._thread = None


async def _anext(agen: AsyncIterator[T]) -> T:
    return await agen.__anext__()


async def _cancel_all(timeout: float) -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)
    await asyncio.get_running_loop().shutdown_asyncgens()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


_loop_threads: weakref.WeakSet[LoopThread] = weakref.WeakSet()
_orphans: list[object] = []
_portal = LoopThread()


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run a coroutine from sync code on the shared loop thread (see :meth:`LoopThread.run`)."""
    return _portal.run(coro, timeout)


async def run_in_portal(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the shared loop thread from any event loop.

    For clients bound to that loop (a backend's redis pool serving both its sync and its
    async API): connections never cross event loops.
    """
    return await _portal.run_from_loop(coro)


def iterate_sync(agen: AsyncIterator[T]) -> Iterator[T]:
    """Iterate an async iterator from sync code on the shared loop thread."""
    return _portal.iterate(agen)


def left_in_parent(*objects: object) -> None:
    """Keep what a forked child inherited but must neither use nor close (the parent's
    connections, on the parent's loop) referenced for good: collected, their finalizers
    would act on sockets the parent still uses."""
    _orphans.extend(o for o in objects if o is not None)


def _after_fork_in_child() -> None:
    for loop_thread in list(_loop_threads):
        loop_thread._after_fork_in_child()


def _stop_at_exit() -> None:
    for loop_thread in list(_loop_threads):
        loop_thread.stop()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_stop_at_exit)

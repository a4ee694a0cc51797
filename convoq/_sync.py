"""The one bridge between sync and async: a long-lived event loop on a daemon thread.

Sync APIs (``Agent.generate``, ``Client``, ``ConversationMemory.load``...) submit their
coroutine here instead of calling ``asyncio.run`` each time, so connection pools (httpx,
redis) created by the coroutine outlive the call, and sync APIs work from inside a running
event loop too. Celery worker processes use the same loop for their tasks.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")


class LoopThread:
    """An event loop running forever on its own daemon thread."""

    def __init__(self, name: str = "convoq-loop") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                self._loop = self._start()
            return self._loop

    def _start(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        threading.Thread(target=run, name=self._name, daemon=True).start()
        ready.wait()
        return loop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop thread and block until it returns or raises."""
        loop = self.loop
        if _running_loop() is loop:
            coro.close()
            raise RuntimeError("a sync convoq API was called from its own loop thread; await it")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

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
                self.run(aclose())


async def _anext(agen: AsyncIterator[T]) -> T:
    return await agen.__anext__()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


_portal = LoopThread()


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run a coroutine from sync code on the shared loop thread."""
    return _portal.run(coro, timeout)


async def run_in_portal(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the shared loop thread from any event loop.

    For clients bound to that loop (a backend's redis pool serving both its sync and its
    async API): connections never cross event loops.
    """
    loop = _portal.loop
    if _running_loop() is loop:
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


def iterate_sync(agen: AsyncIterator[T]) -> Iterator[T]:
    """Iterate an async iterator from sync code on the shared loop thread."""
    return _portal.iterate(agen)


async def call_maybe_async(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Await ``fn`` if it is async; otherwise run it in a worker thread.

    A blocking sync function (a tool, a scripted model) then holds up only its own turn.
    """
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    result = await asyncio.to_thread(fn, *args, **kwargs)
    if isinstance(result, Awaitable):  # a sync callable that returned a coroutine
        return await result
    return result

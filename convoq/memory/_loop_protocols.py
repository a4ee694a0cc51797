"""A Redis memory's own clients: one per event loop that calls it, each used in its loop.

An asyncio Redis client belongs to the loop its connections were opened in. A memory made
from a URL is called from the caller's loop (async methods), from convoq's bridge loop
(sync methods that hop there) and from other loops in turn (a script that calls
``asyncio.run`` twice, a test per loop). Each loop gets its own client on its first call,
so an async call does its I/O in the caller's loop with no hop to another thread.

Each client is closed in its own loop, whichever comes first:

- the loop shuts down: a suspended async generator per client is registered with its loop,
  and ``asyncio.run`` (like ``asyncio.Runner`` and pytest-asyncio) closes every such
  generator before closing the loop; its ``finally`` closes the client;
- the memory is closed (:meth:`LoopProtocols.aclose`/:meth:`LoopProtocols.close`): the
  caller's loop closes its client at once, a loop running on another thread is asked to
  close its own (waited for a bounded time), an idle loop closes it when it runs again;
- the memory is dropped without close: the same, from a finalizer.

A loop closed without that shutdown (``loop.close()`` alone) leaves its client behind: it
is forgotten on the next call from another loop, so clients never pile up. A forked child
never touches the clients it inherited (their sockets are the parent's): it opens its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from convoq._connection_bounds import ConnectionBounds
from convoq._sync import left_in_parent
from convoq.redis._base import connect
from convoq.redis._cluster import AsyncRedis
from convoq.redis.protocol import TurnProtocol
from convoq.redis.roles import MemoryStore
from convoq.settings import ConvoqSettings

# How long close() waits for a loop on another thread to close its client.
CLOSE_WAIT_S = 5.0


@dataclass
class _Opened:
    protocol: MemoryStore
    closer: AsyncGenerator[None, None]  # suspended until its loop shuts down or we close it


class LoopProtocols:
    """The turn protocols of one memory, one per event loop (see the module docstring)."""

    def __init__(self, settings: ConvoqSettings, resolve_url: Callable[[], str]) -> None:
        self._settings = settings
        self._resolve_url = resolve_url
        self._url: str | None = None
        self._url_lock = threading.Lock()
        self._opened: dict[asyncio.AbstractEventLoop, _Opened] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def url(self) -> str:
        """The URL to connect to, resolved once (may start the embedded server: blocks)."""
        if self._url is None:
            with self._url_lock:
                if self._url is None:
                    self._url = self._resolve_url()
        return self._url

    async def current(self) -> MemoryStore:
        """The protocol of the running loop, opened on its first call there."""
        opened = self._opened.get(asyncio.get_running_loop())
        if opened is not None and self._pid == os.getpid():
            return opened.protocol
        return await self._open()

    def loops(self) -> list[asyncio.AbstractEventLoop]:
        """The loops that have a client now (for tests and diagnostics)."""
        with self._lock:
            return list(self._opened)

    async def _open(self) -> MemoryStore:
        self._leave_parent_clients()
        url = self._url if self._url is not None else await asyncio.to_thread(self.url)
        loop = asyncio.get_running_loop()
        opened = self._opened.get(loop)
        if opened is not None:  # another task of this loop opened it while we resolved
            return opened.protocol
        self._forget_closed_loops()
        client = connect(url, bounds=ConnectionBounds.of(self._settings))
        opened = _Opened(TurnProtocol.from_settings(client, self._settings), self._closer(client))
        # Run to its yield inside this loop: the loop now closes it when it shuts down.
        await opened.closer.asend(None)
        with self._lock:
            self._opened[loop] = opened
        return opened.protocol

    async def _closer(self, client: AsyncRedis) -> AsyncGenerator[None, None]:
        loop = asyncio.get_running_loop()
        try:
            yield
        finally:
            with self._lock:
                opened = self._opened.get(loop)
                if opened is not None and opened.protocol.redis is client:
                    del self._opened[loop]
            await client.aclose()

    def _take_all(self) -> list[tuple[asyncio.AbstractEventLoop, _Opened]]:
        with self._lock:
            taken = list(self._opened.items())
            self._opened.clear()
        return taken

    async def aclose(self) -> None:
        """Close every client: the running loop's here, the others in their own loops."""
        self._leave_parent_clients()
        current = asyncio.get_running_loop()
        waits: list[asyncio.Future[None]] = []
        for loop, opened in self._take_all():
            if loop is current:
                await opened.closer.aclose()
                continue
            future = _close_in(loop, opened)
            if future is not None:
                waits.append(asyncio.wrap_future(future))
        if waits:
            await asyncio.wait(waits, timeout=CLOSE_WAIT_S)

    def close(self) -> None:
        """Close every client from sync code (each in its own loop; see :meth:`aclose`)."""
        self._leave_parent_clients()
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, opened in self._take_all():
            future = _close_in(loop, opened)
            # The loop this is called from closes its client when it next gets control.
            if future is not None and loop is not current:
                with contextlib.suppress(concurrent.futures.TimeoutError):
                    future.result(timeout=CLOSE_WAIT_S)

    def close_soon(self) -> None:
        """Ask each loop to close its client, waiting for none: the finalizer of a memory
        dropped without close (a finalizer must not block)."""
        if self._pid == os.getpid():
            for loop, opened in self._take_all():
                _close_in(loop, opened)

    def _forget_closed_loops(self) -> None:
        """Drop the clients of loops closed without shutting down (nothing can close them:
        their sockets go with the garbage collector)."""
        with self._lock:
            for loop in [loop for loop in self._opened if loop.is_closed()]:
                del self._opened[loop]

    def _leave_parent_clients(self) -> None:
        """In a forked child: every client so far is the parent's, left alone for good."""
        if self._pid != os.getpid():
            with self._lock:
                left_in_parent(*self._opened.values())
                self._opened.clear()
            self._pid = os.getpid()


def _close_in(
    loop: asyncio.AbstractEventLoop, opened: _Opened
) -> concurrent.futures.Future[None] | None:
    """Have ``loop`` close ``opened``'s client: the future of that close when the loop is
    running; None when it is not (an idle loop closes it when it runs again, from the
    generator's finalizer: asyncio's own hook; a closed loop cannot close anything)."""
    if not loop.is_running():
        return None
    try:
        return asyncio.run_coroutine_threadsafe(_aclose(opened.closer), loop)
    except RuntimeError:  # closed meanwhile
        return None


async def _aclose(closer: AsyncGenerator[None, None]) -> None:
    await closer.aclose()

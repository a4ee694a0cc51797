"""The one event loop of a worker process and what lives on it: the Redis client, the turn
protocol and the runner, opened on first use (by whichever thread asks first) and closed
once, at shutdown.

Celery's ``threads`` pool runs many tasks at once; each task submits its coroutine to this
loop (:class:`convoq._sync.LoopThread`), so Redis and httpx connection pools live as long
as the process and many model calls are in flight per process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from convoq._connection_bounds import ConnectionBounds
from convoq._sync import LoopThread
from convoq.redis import TurnProtocol, connect
from convoq.redis._cluster import AsyncRedis
from convoq.redis.roles import WorkerStore
from convoq.settings import ConvoqSettings
from convoq.worker.runner import Runner

T = TypeVar("T")


@dataclass(frozen=True)
class Opened:
    """What the loop holds once open."""

    redis: AsyncRedis
    protocol: WorkerStore
    runner: Runner
    epoch: str
    """The dataset's epoch marker when the worker opened it (checked again each period)."""


class WorkerLoop:
    """The process's loop thread and the connections on it (see the module docstring).
    ``runner_for(protocol)`` builds the runner once the protocol is open."""

    def __init__(
        self,
        settings: ConvoqSettings,
        redis_url: str,
        runner_for: Callable[[WorkerStore], Runner],
    ) -> None:
        self._settings = settings
        self._redis_url = redis_url
        self._runner_for = runner_for
        self.thread = LoopThread("convoq-worker-loop")
        self._open_lock = threading.Lock()
        self._opened: Opened | None = None

    @property
    def opened(self) -> Opened | None:
        """What the loop holds if it was opened (never opens it)."""
        return self._opened

    def open(self) -> Opened:
        """What the loop holds, opening it on first use."""
        with self._open_lock:
            if self._opened is None:
                self._opened = self.thread.run(self._open())
            return self._opened

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop (opening connections on first use)."""
        self.open()
        return self.thread.run(coro)

    async def _open(self) -> Opened:
        s = self._settings
        # Each turn in flight holds a connection only per command; renewers and the
        # sweeper add a few. Beyond the limit commands wait for a free connection.
        redis = connect(
            self._redis_url,
            max_connections=2 * s.concurrency + 16,
            bounds=ConnectionBounds.of(s),
        )
        protocol = TurnProtocol.from_settings(redis, s)
        runner = self._runner_for(protocol)
        epoch = await protocol.check_epoch(None)
        return Opened(redis, protocol, runner, epoch)

    async def close_connections(self) -> None:
        """Close the protocol and the Redis client (on the loop; only once opened)."""
        assert self._opened is not None
        await self._opened.protocol.close()
        await self._opened.redis.aclose()

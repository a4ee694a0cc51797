"""Shutting a worker process down: a warm shutdown's start (no new turn, the process's line
flushed to the broker, running turns bounded by the grace), the close (sweeper, drains
started by the consumer, connections, MCP sessions), and the last bound.

The last bound: the process exits even when a thread cannot be stopped. A turn's run is
cancelled at shutdown once its grace ran out, but a blocking call running in a worker
thread (a sync model or tool, via ``asyncio.to_thread``) cannot be interrupted, and the
interpreter joins such threads at exit without a bound. The turn itself is safe (handed
back, its writes fenced); only the process would hang. So a warm shutdown arms a deadline
after which the process exits at once (:func:`arm_exit_deadline`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from convoq import mcp
from convoq.settings import ConvoqSettings

if TYPE_CHECKING:
    from convoq.worker._direct import DirectDrains
    from convoq.worker._drains import Serving
    from convoq.worker._event_loop import WorkerLoop
    from convoq.worker._fair import SlotBacklog
    from convoq.worker._heartbeat import Heartbeat

log = logging.getLogger("convoq.worker")
# Closing connections at shutdown waits this long at most.
_CLOSE_TIMEOUT_S = 5.0
# Once a warm shutdown closed everything, the process exits within this long.
_EXIT_AFTER_CLOSE_S = 2.0


class Shutdown:
    """How this worker process winds down (see the module docstring)."""

    def __init__(
        self,
        settings: ConvoqSettings,
        loop: WorkerLoop,
        backlog: SlotBacklog,
        serving: Serving,
        direct: DirectDrains,
        heartbeat: Heartbeat,
        mcp_servers: list[Any],
    ) -> None:
        self._settings = settings
        self._loop = loop
        self._backlog = backlog
        self._serving = serving
        self._direct = direct
        self._heartbeat = heartbeat
        self._mcp_servers = mcp_servers

    def begin(self) -> None:
        """Warm shutdown began (SIGTERM): running turns finish within the grace or are
        handed back, so the pool's wait for its tasks is bounded; no new turn starts.
        Called from the signal handler of a worker process: it only schedules the change
        on the loop, and arms the process's exit deadline."""
        s = self._settings
        self._serving.stopping = True
        # The pool drops the jobs it has not started: conversations waiting in this
        # process's line go to the broker for other workers (a thread: this is a handler).
        self._backlog.detach()
        threading.Thread(target=self._backlog.flush, name="convoq-flush", daemon=True).start()
        arm_exit_deadline(s.shutdown_grace_s + 2 * s.lease_ms / 1000 + _CLOSE_TIMEOUT_S + 5)
        opened = self._loop.opened
        if opened is not None:
            self._loop.thread.loop.call_soon_threadsafe(opened.runner.begin_shutdown)

    def close(self) -> None:
        """Stop the sweeper, withdraw the worker entry and close connections."""
        self._heartbeat.stop()
        if self._loop.opened is not None and self._direct.running:
            # Drains started from the consumer are no pool tasks: Celery did not wait for
            # them. Shutting down, they end within the grace or hand their turn back.
            s = self._settings
            wait_s = s.shutdown_grace_s + s.lease_ms / 1000 + 1
            try:
                self._loop.thread.run(self._direct.ended_all(wait_s), timeout=wait_s + 1)
            except Exception as exc:  # shutting down anyway
                log.warning("waiting for the running drains failed: %s", exc)
        if self._loop.opened is not None:
            try:
                self._loop.thread.run(self._close(), timeout=_CLOSE_TIMEOUT_S)
            except Exception as exc:  # shutting down anyway
                log.warning("closing the worker's Redis connections failed: %s", exc)
        if self._serving.stopping:
            # All that is left is the interpreter's exit, which joins threads that may
            # still run a blocking call nothing can stop.
            arm_exit_deadline(_EXIT_AFTER_CLOSE_S)

    async def _close(self) -> None:
        opened = self._loop.opened
        assert opened is not None
        await self._heartbeat.withdraw(opened.redis)
        await self._loop.close_connections()
        # Stops stdio MCP servers: none outlives a worker that shuts down.
        await mcp.close_all(self._mcp_servers)


def arm_exit_deadline(timeout_s: float) -> threading.Timer:
    """Exit the process (status 0) if it is still up ``timeout_s`` from now. Only for a
    worker process shutting down: never arm it in a process that has other work."""

    def exit_now() -> None:
        log.warning(
            "warm shutdown: still up %.0fs after it began (a thread that cannot be stopped"
            " is still running); exiting now, its turns were handed back",
            timeout_s,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    timer = threading.Timer(timeout_s, exit_now)
    timer.daemon = True
    timer.start()
    return timer

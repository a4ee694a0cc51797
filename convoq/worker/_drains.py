"""Drains in a worker process, and whether it still starts them.

A drain runs on the process's loop, holding a slot (:mod:`._fair`). It starts from a Celery
task on a pool thread (:meth:`Drains.from_task`), from a conversation this process sent
back in its own line (:meth:`Drains.from_line`), or from the consumer itself
(:class:`convoq.worker._direct.DirectDrains`). None starts once the process stops serving
(:class:`Serving`): a warm shutdown began, or the dataset came back empty.
"""

from __future__ import annotations

import concurrent.futures
import logging

from convoq.errors import ConversationMemoryError
from convoq.observe import tracing
from convoq.worker import _observed
from convoq.worker._direct import DirectDrains
from convoq.worker._event_loop import WorkerLoop
from convoq.worker._fair import Kept, SlotBacklog
from convoq.worker._kicks import Kicks, hints, kick_header
from convoq.worker.runner import DrainReport

log = logging.getLogger("convoq.worker")


class Serving:
    """Whether this process still starts drains: not once a warm shutdown began
    (``stopping``), nor once it refused a dataset that came back empty (``halted``)."""

    def __init__(self) -> None:
        self.halted: ConversationMemoryError | None = None
        self.stopping = False

    @property
    def accepting(self) -> bool:
        return self.halted is None and not self.stopping


class Drains:
    """Drains started by the pool: Celery's tasks and the conversations of this process's
    line (see the module docstring)."""

    def __init__(
        self,
        loop: WorkerLoop,
        backlog: SlotBacklog,
        kicks: Kicks,
        serving: Serving,
        direct: DirectDrains,
    ) -> None:
        self._loop = loop
        self._backlog = backlog
        self._kicks = kicks
        self._serving = serving
        self._direct = direct

    def from_task(self, conversation_id: str) -> DrainReport:
        """The drain a ``convoq.drain`` (or ``convoq.resume``) task asks for, with the
        hints its kick carries."""
        if self._serving.halted is not None:
            raise self._serving.halted
        head, fence = hints()
        return self._run(conversation_id, head, fence, kick_header(tracing.HEADER))

    def from_line(self, kept: Kept) -> None:
        """Run a conversation this process sent back in its own line (on a pool thread)."""
        if not self._serving.accepting:
            self._kicks.requeue(*kept)  # for another worker, at once
            return
        self._run(kept.conversation_id, kept.head, kept.fence, None)

    def use_pool(self, consumer: object) -> None:
        """The task queue of the consumer's threads pool becomes the line conversations go
        back to (:mod:`._fair`), and kicks may start drains directly (:mod:`._direct`);
        with any other pool, or the fast paths off, they go back through the broker."""
        if not self._backlog.own_line:
            log.info("fair slots: conversations go back through the broker (fast paths off)")
            return
        executor = getattr(getattr(consumer, "pool", None), "executor", None)
        window = getattr(consumer, "initial_prefetch_count", None)
        if isinstance(executor, concurrent.futures.ThreadPoolExecutor):
            window = window if isinstance(window, int) else None
            self._backlog.attach(executor.submit, self.from_line, window=window)
            self._direct.enable()
            log.info("fair slots: conversations go back in this process's line (window %s)", window)

    def _run(self, cid: str, head: str | None, fence: int, trace_header: str | None) -> DrainReport:
        """A drain on the process's loop, holding a slot while it runs."""
        drain = self._loop.open().runner.drain(cid, head=head, fence=fence)
        with self._backlog.slot():
            return self._loop.run(_observed.traced_drain(drain, cid, trace_header))

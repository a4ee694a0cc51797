"""Direct kicks: a ``convoq.drain`` kick that finds a free slot starts on the process's
event loop from the consumer, without Celery's request, pool thread and the hop from that
thread to the loop and back.

Celery builds a handler per task (the task's ``Strategy``) that the consumer calls with
each message of the task. Convoq's drain gets :func:`strategy`: a message it can take
(protocol 2, the conversation id as its only argument, no ETA, expiry, revocation or
task events, the runtime ready and not shutting down) and a slot of the process that is
free with nothing waiting for it (:meth:`SlotBacklog.take_free_slot`) runs as a task on
the loop; when the drain ends its slot is given back and the message is acknowledged
through the consumer, as Celery acknowledges a late-acked task, also when the drain
raised (``task_acks_on_failure_or_timeout``). Any other message goes Celery's way
(Celery's own handler, built here). The drains so started are :class:`DirectDrains`'s
until they end.

What is kept: the kick is acknowledged only after its drain (a worker killed meanwhile
leaves it unacknowledged, and the broker's visibility timeout or the sweeper runs the
conversation again); the prefetch window still bounds the kicks a process holds; no
slot is used twice; a kick that came while others wait for a slot runs after them.

A fenced shortcut: it relies on Celery's strategy interface (``task.Strategy``, the
handler's arguments) and its message protocol 2, checked with the releases in
:data:`CHECKED_WITH`, and is used only with ``CONVOQ_FAST_PATHS`` on, Celery in those
releases (:func:`enabled`) and the threads pool (the runtime's line attached); off, every
kick goes through Celery's request and pool.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery.worker import state
from celery.worker.strategy import default

from convoq.observe import tracing
from convoq.queue.transport import FENCE_HEADER, HEAD_HEADER
from convoq.settings import fast_path
from convoq.worker import _observed
from convoq.worker._kicks import fence_of

if TYPE_CHECKING:
    from convoq.worker._drains import Serving
    from convoq.worker._event_loop import WorkerLoop
    from convoq.worker._fair import SlotBacklog
    from convoq.worker.app import ConvoqCelery
    from convoq.worker.runner import DrainReport, Runner
    from convoq.worker.runtime import WorkerRuntime

log = logging.getLogger("convoq.worker")
CHECKED_WITH = ("celery", ">=5.4,<5.8")
"""The Celery releases whose strategy interface and task messages this module relies on:
outside them :func:`enabled` answers False (and says so once in the log)."""
STRATEGY = "convoq.worker._direct:strategy"
"""What the drain task's ``Strategy`` names with the fast paths on."""

Handler = Callable[..., Any]


def enabled(explicit: bool | None = None) -> bool:
    """Whether the drain task gets :func:`strategy`: the fast paths on (``explicit``, else
    ``CONVOQ_FAST_PATHS``) and Celery a release of :data:`CHECKED_WITH`."""
    return fast_path("direct kicks", (CHECKED_WITH,), explicit)


def strategy(task: Any, app: ConvoqCelery, consumer: Any, **options: Any) -> Handler:
    """The drain task's message handler (see the module docstring); Celery calls this once
    per consumer start, with the arguments of its default strategy."""
    celery_way = default(task, app, consumer, **options)
    eventer = consumer.event_dispatcher
    errors = consumer.connection_errors
    runtime: WorkerRuntime | None = None

    def handler(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any) -> Any:
        nonlocal runtime
        if runtime is None:
            runtime = app.runtime()
        kick = None if callbacks or _events_on(eventer) else _kick_of(message)
        if kick is None or not runtime.direct.start(*kick, done=lambda: ack(log, errors)):
            return celery_way(message, body, ack, reject, callbacks)
        return None

    return handler


def _events_on(eventer: Any) -> bool:
    """Whether task events are sent (then Celery's request sends them)."""
    if eventer is None or not eventer.enabled:
        return False
    groups = eventer.groups
    return not groups or "task" in groups


def _kick_of(message: Any) -> tuple[str, str | None, str | None, str | None] | None:
    """(conversation id, head hint, fence hint, traceparent) of a plain drain kick, or
    None for anything Celery should handle (protocol 1, an ETA or expiry, a revoked id,
    arguments other than one string)."""
    headers = message.headers
    if not isinstance(headers, dict) or "task" not in headers:
        return None
    if headers.get("eta") or headers.get("expires") or headers.get("id") in state.revoked:
        return None
    try:
        payload = message.decode()
    except Exception:  # Celery's way reports it
        return None
    if not (isinstance(payload, list | tuple) and len(payload) == 3):
        return None
    args, kwargs, _embed = payload
    if kwargs or not (isinstance(args, list) and len(args) == 1 and isinstance(args[0], str)):
        return None
    head, fence = _text(headers, HEAD_HEADER), _text(headers, FENCE_HEADER)
    return args[0], head, fence, _text(headers, tracing.HEADER)


def _text(headers: dict[str, Any], name: str) -> str | None:
    value = headers.get(name)
    return value if isinstance(value, str) else None


class DirectDrains:
    """The drains kicks start on the loop from the consumer (:func:`strategy`), until they
    end; none starts before the pool's line is attached (:meth:`enable`)."""

    def __init__(self, loop: WorkerLoop, backlog: SlotBacklog, serving: Serving) -> None:
        self._loop = loop
        self._backlog = backlog
        self._serving = serving
        self._on = False
        self._runs: set[asyncio.Task[DrainReport]] = set()

    def enable(self) -> None:
        """Kicks may start drains from now on (the pool's line is attached)."""
        self._on = True

    @property
    def running(self) -> bool:
        """Whether a drain started so has not ended yet."""
        return bool(self._runs)

    def start(
        self,
        cid: str,
        head: str | None,
        fence: str | None,
        traceparent: str | None,
        *,
        done: Callable[[], object],
    ) -> bool:
        """Start a drain of ``cid`` on the loop if a slot is free and nothing waits for it;
        ``done`` (the kick's acknowledgement) is called when it ends. False: nothing
        started, the kick goes Celery's way."""
        opened = self._loop.opened
        if opened is None or not self._on or not self._serving.accepting:
            return False
        if not self._backlog.take_free_slot():
            return False
        try:
            self._loop.thread.loop.call_soon_threadsafe(
                self._start, opened.runner, cid, head, fence_of(fence), traceparent, done
            )
        except RuntimeError:  # the loop is closed: shutting down
            self._backlog.release(direct=True)
            return False
        return True

    async def ended_all(self, timeout_s: float) -> None:
        """Until every drain started so ended, ``timeout_s`` at most."""
        if self._runs:
            await asyncio.wait(set(self._runs), timeout=timeout_s)

    def _start(
        self,
        runner: Runner,
        cid: str,
        head: str | None,
        fence: int,
        traceparent: str | None,
        done: Callable[[], object],
    ) -> None:
        drain = runner.drain(cid, head=head, fence=fence)
        task = asyncio.ensure_future(_observed.traced_drain(drain, cid, traceparent))
        self._runs.add(task)
        task.add_done_callback(functools.partial(self._ended, cid, done))

    def _ended(self, cid: str, done: Callable[[], object], task: asyncio.Task[DrainReport]) -> None:
        self._runs.discard(task)
        self._backlog.release(direct=True)
        if task.cancelled():  # the loop stops: the kick stays unacknowledged
            return
        if (exc := task.exception()) is not None:
            # As Celery reports a task that raised; the kick is acknowledged all the same.
            log.error("drain of %s raised: %r", cid, exc, exc_info=exc)
        try:
            done()
        except Exception:
            log.exception("acknowledging the kick of %s failed", cid)

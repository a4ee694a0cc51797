"""What a worker tells metrics and traces about a turn run: a ``convoq.turn`` span (in
the trace of the turn's submit), the run counted by agent and outcome with its run time,
and the queue wait of a first run. The runner marks the points only it knows (a failure,
a lost lease); everything else is read from the :class:`DrainReport` it fills."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from convoq.errors import ConfigurationError, GuardrailTripped, TurnCancelledError
from convoq.observe import metrics, tracing
from convoq.queue.routing import partition_of
from convoq.redis import KeySchema
from convoq.redis._cluster import AsyncRedis
from convoq.redis.protocol import Acquired
from convoq.settings import ConvoqSettings

if TYPE_CHECKING:
    from convoq.worker.runner import DrainReport

log = logging.getLogger("convoq.worker")
A = TypeVar("A")
T = TypeVar("T")


@dataclass
class _Watch:
    error: BaseException | None = None


_current: ContextVar[_Watch | None] = ContextVar("convoq_turn_watch", default=None)


@contextlib.contextmanager
def watched_turn(acq: Acquired, report: DrainReport) -> Iterator[None]:
    """Observe one run of ``acq``'s turn; its outcome is read from ``report`` after it."""
    turn = acq.turn
    first_run = turn.attempts <= 1 and acq.state is None
    wait_s = None
    if first_run and turn.started_ms is not None:
        wait_s = (turn.started_ms - turn.created_ms) / 1000
    metrics.turn_started(turn.agent, wait_s)
    watch = _Watch()
    token = _current.set(watch)
    attributes: dict[str, str | int] = {
        "convoq.conversation_id": turn.conversation_id,
        "convoq.turn_id": turn.turn_id,
        "convoq.agent": turn.agent,
        "convoq.attempt": turn.attempts,
    }
    started = time.monotonic()
    try:
        with tracing.span("convoq.turn", attributes, parent=_submit_context(turn.options)):
            yield
    finally:
        _current.reset(token)
        outcome = _outcome(report, turn.turn_id, watch)
        metrics.turn_ran(turn.agent, outcome, time.monotonic() - started)


def failed(error: BaseException) -> None:
    """The running turn ends failed (or cancelled) with ``error``."""
    watch = _current.get()
    if watch is not None:
        watch.error = error
    if isinstance(error, TurnCancelledError):
        tracing.set_attribute("convoq.cancelled", True)
    else:
        tracing.record_error(error)


def in_span(name: str, call: Callable[[A], Awaitable[T]]) -> Callable[[A], Awaitable[T]]:
    """``call`` with a span of its own around each call."""

    async def traced(arg: A) -> T:
        with tracing.span(name):
            return await call(arg)

    return traced


def lease_lost() -> None:
    metrics.LEASES_LOST.inc()


def _outcome(report: DrainReport, turn_id: str, watch: _Watch) -> str:
    if turn_id in report.succeeded:
        return "succeeded"
    if turn_id in report.expired:
        return "expired"
    if turn_id in report.interrupted:
        return "interrupted"
    if turn_id in report.failed:
        if isinstance(watch.error, GuardrailTripped):
            return "blocked"
        return "cancelled" if isinstance(watch.error, TurnCancelledError) else "failed"
    if turn_id in report.parked:
        return "parked"
    return "abandoned"


def _submit_context(options: Mapping[str, Any]) -> dict[str, str] | None:
    """The trace context the client stored with the turn (see :mod:`convoq.observe.tracing`)."""
    stored = options.get(tracing.OPTION)
    if not isinstance(stored, Mapping):
        return None
    return {str(k): v for k, v in stored.items() if isinstance(v, str)} or None


async def measure_inboxes(redis: AsyncRedis, keys: KeySchema, partitions: int) -> None:
    """Set the inbox depth gauge of every partition: one SCAN over the inboxes (an empty
    inbox has no key) and their lengths, pipelined."""
    depths: dict[int, int] = {}
    batch: list[str] = []

    async def count() -> None:
        async with redis.pipeline(transaction=False) as pipe:
            for cid in batch:
                pipe.llen(keys.inbox(cid))
            lengths = await pipe.execute()
        for cid, length in zip(batch, lengths, strict=True):
            part = partition_of(cid, partitions)
            depths[part] = depths.get(part, 0) + int(length)
        batch.clear()

    async for key in redis.scan_iter(match=keys.inbox_pattern(), count=1000):
        cid = keys.conversation_of_inbox(key)  # None: not a valid conversation id
        if cid is not None:
            batch.append(cid)
        if len(batch) >= 500:
            await count()
    await count()
    metrics.inbox_depths(depths, partitions)


def count_timers(waiting: dict[str, int], partitions: int) -> None:
    """Set the gauge of turns waiting on a timer per partition from ``waiting``
    (conversation id -> its timers)."""
    counts: dict[int, int] = {}
    for cid, timers in waiting.items():
        part = partition_of(cid, partitions)
        counts[part] = counts.get(part, 0) + timers
    metrics.timers_waiting(counts, partitions)


def serve_metrics(settings: ConvoqSettings) -> metrics.MetricsServer | None:
    """The worker's /metrics server, if ``metrics_port`` is set."""
    if settings.metrics_port is None:
        return None
    server = metrics.serve(settings.metrics_port, settings.metrics_host)
    log.info("metrics on http://%s:%d/metrics", settings.metrics_host, server.port)
    return server


def export_spans(path: Path) -> None:
    """Append this worker's spans to ``path`` (``CONVOQ_TRACE_FILE``)."""
    try:
        tracing.export_to_file(path, service_name="convoq-worker")
    except ImportError as exc:
        raise ConfigurationError(
            f"CONVOQ_TRACE_FILE needs OpenTelemetry: pip install 'convoq[otel]' ({exc})"
        ) from None


def traced_drain(
    drain: Coroutine[Any, Any, T], cid: str, traceparent: str | None
) -> Coroutine[Any, Any, T]:
    """``drain`` in a ``convoq.drain`` span continuing the kick's trace (its header)."""
    parent = {tracing.HEADER: traceparent} if traceparent else None
    return tracing.traced(drain, "convoq.drain", {"convoq.conversation_id": cid}, parent=parent)

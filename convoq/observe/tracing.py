"""Optional OpenTelemetry traces: one trace per turn, from ``submit`` to the commit.

The client opens ``convoq.submit`` and, inside it, ``convoq.kick`` around the Celery send;
the kick carries the W3C ``traceparent`` in its message headers (:data:`HEADER`), and the
turn record keeps the submit's in its options (:data:`OPTION`), so a turn resumed after an
approval or re-kicked by the sweeper still joins its trace. On the worker, ``convoq.drain``
continues the kick's context and holds ``convoq.acquire``; each turn run is a
``convoq.turn`` span holding ``convoq.model`` per model call, ``convoq.tool`` per tool call
and ``convoq.commit`` / ``convoq.fail`` / ``convoq.park``. A turn that is not the one its
drain was kicked for (handed over by the commit before it) starts from its own submit's
context and links to the drain. Errors are recorded on the span they happened in.

Only ``opentelemetry-api`` is used, through the global tracer provider: an application
configures the SDK and its exporters (``opentelemetry-instrument``, or its own code in the
agents module); :func:`export_to_file` is a JSON-lines exporter for tests and debugging
(``CONVOQ_TRACE_FILE`` on workers). Without ``opentelemetry-api`` installed, every
function here is a no-op that imports nothing. With the API but no tracer provider set,
:func:`span` opens no span at all: the API's spans would record nothing and only hand
their parent's context on, and a worker opens several per turn.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import (
        Link,
        NoOpTracerProvider,
        ProxyTracerProvider,
        Status,
        StatusCode,
    )

    ENABLED = True
    # A proxy until the application installs a provider, then that provider's tracer.
    _tracer = trace.get_tracer("convoq")
except ImportError:  # pragma: no cover - exercised by a test in a subprocess
    ENABLED = False

T = TypeVar("T")
HEADER = "traceparent"
"""The Celery message header (W3C Trace Context) a kick carries."""
OPTION = "trace"
"""The turn record option holding the submit's trace context (``{"traceparent": ...}``)."""

Attributes = Mapping[str, str | int | float | bool]


@contextlib.contextmanager
def span(
    name: str, attributes: Attributes | None = None, *, parent: Mapping[str, str] | None = None
) -> Iterator[None]:
    """A span around the block, child of the current span, or of ``parent`` (a carrier
    with ``traceparent``) when that belongs to another trace than the current span (the
    current one is then linked). An exception leaving the block is recorded on it.
    Nothing is opened while no tracer provider is set (see the module docstring)."""
    if not ENABLED or not recording():
        yield
        return
    context, links = None, []
    if parent:
        current = trace.get_current_span().get_span_context()
        context = propagate.extract(parent)
        theirs = trace.get_current_span(context).get_span_context()
        if theirs.is_valid and theirs.trace_id == current.trace_id:
            context = None  # the current span already is in that trace: nest under it
        elif current.is_valid:
            links = [Link(current)]
    with _tracer.start_as_current_span(name, context=context, attributes=attributes, links=links):
        yield


async def traced(
    coro: Coroutine[Any, Any, T],
    name: str,
    attributes: Attributes | None = None,
    *,
    parent: Mapping[str, str] | None = None,
) -> T:
    """Await ``coro`` inside a span (the span lives in the task that runs it)."""
    with span(name, attributes, parent=parent):
        return await coro


def recording() -> bool:
    """Whether an application set a tracer provider (``trace.set_tracer_provider`` or the
    ``OTEL_PYTHON_TRACER_PROVIDER`` variable): until then the global one is the API's proxy,
    whose spans record nothing."""
    if not ENABLED:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, ProxyTracerProvider | NoOpTracerProvider)


def record_error(error: BaseException) -> None:
    """Mark the current span failed with ``error`` (for errors that are handled, not
    raised through the span)."""
    if not ENABLED:
        return
    current = trace.get_current_span()
    current.record_exception(error)
    current.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


def set_attribute(key: str, value: str | int | float | bool) -> None:
    """Set an attribute on the current span."""
    if ENABLED:
        trace.get_current_span().set_attribute(key, value)


def carrier() -> dict[str, str]:
    """The current span's context as W3C headers (empty without a recording span)."""
    if not ENABLED:
        return {}
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return {key: value for key, value in headers.items() if key in (HEADER, "tracestate")}


def export_to_file(path: str | os.PathLike[str], service_name: str = "convoq") -> None:
    """Append this process's finished spans to ``path`` as JSON lines.

    Raises:
        ImportError: ``opentelemetry-sdk`` is not installed (``pip install convoq[otel]``).
    """
    from convoq.observe._file_export import export_to_file as install

    install(Path(path), service_name)

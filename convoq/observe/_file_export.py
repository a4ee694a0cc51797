"""A span exporter writing JSON lines to a file (``CONVOQ_TRACE_FILE``): finished spans
of a worker where a test or a developer can read them, with no collector. Needs
``opentelemetry-sdk``."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class JsonLinesExporter(SpanExporter):
    """Appends one JSON object per span (the SDK's ``to_json`` form) to ``path``."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(json.loads(s.to_json(indent=None))) + "\n" for s in spans)
        with self._lock:
            # One append per batch: several processes may share the file.
            fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, lines.encode())
            finally:
                os.close(fd)
        return SpanExportResult.SUCCESS


def export_to_file(path: Path, service_name: str) -> None:
    """Send every finished span to ``path``: through the SDK provider already installed,
    else through a new one made the global provider."""
    processor = SimpleSpanProcessor(JsonLinesExporter(path))
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        trace.set_tracer_provider(provider)
    provider.add_span_processor(processor)

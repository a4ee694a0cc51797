"""Reading convoq's metrics and spans in tests: a scrape parsed into samples, the
in-memory span exporter on this process's tracer provider, and the JSON-lines spans a
worker wrote (``CONVOQ_TRACE_FILE``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """A Prometheus text exposition as ``{(sample name, labels): value}``."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(port: int) -> Samples:
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    response.raise_for_status()
    return parse(response.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value (0 when absent: a counter not yet touched)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def memory_exporter() -> InMemorySpanExporter:
    """An in-memory exporter on this process's SDK tracer provider (installed once: the
    global provider cannot be replaced)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def file_spans(path: Path) -> list[dict[str, Any]]:
    """The spans a worker appended to ``path`` (JSON lines), ids as 32/16 hex digits."""
    if not path.exists():
        return []
    return [_normalised(json.loads(line)) for line in _lines(path)]


def _lines(path: Path) -> Iterator[str]:
    for line in path.read_text().splitlines():
        if line.strip():
            yield line


def _normalised(span: dict[str, Any]) -> dict[str, Any]:
    def hex_id(raw: str | None) -> str | None:
        return None if raw is None else raw.removeprefix("0x")

    context = span["context"]
    return {
        **span,
        "trace_id": hex_id(context["trace_id"]),
        "span_id": hex_id(context["span_id"]),
        "parent_id": hex_id(span.get("parent_id")),
    }

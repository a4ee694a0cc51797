"""Metrics and traces of a real worker process: its /metrics endpoint scraped after
turns of every outcome, and one trace crossing from the client into the worker."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY

from convoq.client import AsyncClient, Client
from convoq.errors import ModelError
from convoq.ids import new_turn_id
from convoq.messages import Message
from convoq.observe import tracing
from convoq.queue.routing import partition_of
from tests.support.gateway import running_gateway
from tests.support.redis_server import RedisServer
from tests.support.telemetry import Samples, file_spans, memory_exporter, parse, scrape, value
from tests.support.workers import (
    WorkerPool,
    running_pool,
    wait_until,
    webhook_receiver,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces") / "worker-spans.jsonl"


@pytest.fixture(scope="module")
def pool(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, trace_file: Path
) -> Iterator[WorkerPool]:
    logs = tmp_path_factory.mktemp("observed-workers")
    # Renewals happen while a blocked turn runs (every lease_ms / 3); a lease of 3 s
    # leaves a busy machine 2 s of slack before it would lapse.
    settings = {
        "metrics_port": 0,
        "metrics_host": "127.0.0.1",
        "trace_file": trace_file,
        "lease_ms": 3000,
    }
    with running_pool(redis_server.url, logs, 1, **settings) as started:
        yield started


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    return memory_exporter()


def _port(client: Client) -> int:
    (info,) = client.workers().values()
    return int(info["metrics_port"])


def _cid(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


def _moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_worker_endpoint_counts_turns_by_agent_and_outcome(
    pool: WorkerPool, client: Client
) -> None:
    port = _port(client)
    before = scrape(port)
    submitted = REGISTRY.get_sample_value("convoq_turns_submitted_total", {"agent": "echo"}) or 0
    assert client.submit(_cid("m-ok"), "hello", agent="echo").wait(30).text == "seen: hello"
    with pytest.raises(ModelError):
        client.submit(_cid("m-fail"), "boom", agent="failer").wait(30)
    parked = client.submit(_cid("m-park"), "pay", agent="approver")
    (call,) = parked.wait(30).pending_approvals
    client.approve(parked, call.id)
    assert "after tool" in parked.wait(30).text
    # Two model calls reporting usage (tests.support.worker_agents.metered).
    assert client.submit(_cid("m-usage"), "count", agent="metered").wait(30).text
    after = scrape(port)

    # The client counted its submit in this process; the worker everything after it.
    assert REGISTRY.get_sample_value("convoq_turns_submitted_total", {"agent": "echo"}) == (
        submitted + 1
    )
    assert _moved(before, after, "convoq_turns_started_total", agent="echo") == 1
    assert _moved(before, after, "convoq_turns_finished_total", agent="echo", status="succeeded")
    assert _moved(before, after, "convoq_turns_finished_total", agent="failer", status="failed")
    assert _moved(before, after, "convoq_turns_parked_total", agent="approver") == 1
    # Parked, then resumed: two runs, one success.
    assert _moved(before, after, "convoq_turns_started_total", agent="approver") == 2
    assert _moved(
        before, after, "convoq_turns_finished_total", agent="approver", status="succeeded"
    )
    assert _moved(before, after, "convoq_turn_queue_wait_seconds_count", agent="echo") == 1
    assert _moved(before, after, "convoq_turn_run_seconds_count", agent="failer", outcome="failed")
    assert _moved(
        before, after, "convoq_model_request_seconds_count", model="scripted", outcome="ok"
    )
    assert _moved(before, after, "convoq_model_errors_total", model="scripted", status="ModelError")
    assert _moved(before, after, "convoq_tool_calls_total", tool="transfer", outcome="ok") == 1
    tokens = {
        kind: _moved(before, after, "convoq_model_tokens_total", model="scripted", kind=kind)
        for kind in ("input", "output", "cached", "reasoning")
    }
    assert tokens == {"input": 230, "output": 30, "cached": 64, "reasoning": 5}


def test_worker_endpoint_counts_leases_cancels_inboxes_webhooks_and_sweeps(
    pool: WorkerPool, client: Client, r: redis.Redis
) -> None:
    port = _port(client)
    before = scrape(port)
    cid = _cid("m-block")
    word = cid.replace("-", "")
    running = client.submit(cid, f"{word} first", agent="blocker")
    with webhook_receiver() as receiver:
        queued = client.submit(
            cid, f"{word} second", agent="echo", callback_url=f"{receiver.url}/done"
        )
        # While the first turn holds the conversation: renewals, and both turns queued.
        part = str(partition_of(cid, pool.partitions))
        wait_until(
            lambda: value(scrape(port), "convoq_inbox_depth", partition=part) >= 2,
            what="the sweep to see both turns in the inbox",
        )
        wait_until(
            lambda: _moved(before, scrape(port), "convoq_lease_renewals_total") > 0,
            what="a lease renewal",
        )
        client.cancel(running)
        r.set(f"{pool.prefix}:test:release:{word}", "1")
        assert queued.wait(30).text.startswith("seen:")
        wait_until(lambda: receiver.posts("/done"), what="the webhook")
    wait_until(
        lambda: _moved(
            before, scrape(port), "convoq_webhook_deliveries_total", outcome="delivered"
        ),
        what="the delivery to be counted",
    )
    stranded = asyncio.run(_strand(pool))  # queued with no kick: the sweeper finds it
    wait_until(lambda: client.history(stranded), what="the sweeper to run the stranded turn")
    after = scrape(port)
    assert _moved(before, after, "convoq_turns_finished_total", agent="blocker", status="cancelled")
    assert _moved(before, after, "convoq_sweeper_kicks_total") >= 1


async def _strand(pool: WorkerPool) -> str:
    cid = _cid("m-stranded")
    async with AsyncClient(pool.redis_url, prefix=pool.prefix, partitions=pool.partitions) as c:
        await c.protocol.submit(
            cid, new_turn_id(), agent="echo", message=Message.user("lost kick"), options={}
        )
    return cid


def _tree(spans: list[dict[str, Any]], trace_id: str) -> dict[str, dict[str, Any]]:
    """The spans of one trace by name (each name once in these turns)."""
    return {s["name"]: s for s in spans if s["trace_id"] == trace_id}


def test_one_trace_crosses_from_submit_to_the_commit_on_the_worker(
    pool: WorkerPool, client: Client, spans: InMemorySpanExporter, trace_file: Path
) -> None:
    spans.clear()
    cid = _cid("t-ok")
    with tracing.span("app.request"):  # the application's own span, around a sync call
        handle = client.submit(cid, "trace me", agent="echo")
    assert handle.wait(30).text == "seen: trace me"
    mine = {s.name: s for s in spans.get_finished_spans()}
    app, submit, kick = mine["app.request"], mine["convoq.submit"], mine["convoq.kick"]
    assert submit.parent is not None and submit.parent.span_id == app.context.span_id
    trace_id = f"{submit.context.trace_id:032x}"
    assert kick.parent is not None and kick.parent.span_id == submit.context.span_id
    worker = wait_until(
        lambda: (t := _tree(file_spans(trace_file), trace_id)) and "convoq.drain" in t and t,
        what="the worker's spans of this trace",
    )
    drain, acquire, turn = worker["convoq.drain"], worker["convoq.acquire"], worker["convoq.turn"]
    assert drain["parent_id"] == f"{kick.context.span_id:016x}"  # continued from the header
    assert acquire["parent_id"] == drain["span_id"]
    assert turn["parent_id"] == drain["span_id"]
    assert worker["convoq.model"]["parent_id"] == turn["span_id"]
    assert worker["convoq.commit"]["parent_id"] == turn["span_id"]
    assert turn["attributes"]["convoq.turn_id"] == handle.turn_id
    assert submit.attributes is not None and submit.attributes["convoq.turn_id"] == handle.turn_id


def test_a_resumed_turn_joins_its_submit_trace_and_errors_are_recorded(
    pool: WorkerPool, client: Client, spans: InMemorySpanExporter, trace_file: Path
) -> None:
    spans.clear()
    parked = client.submit(_cid("t-park"), "pay", agent="approver")
    failing = client.submit(_cid("t-fail"), "boom", agent="failer")
    (call,) = parked.wait(30).pending_approvals
    client.approve(parked, call.id)  # resumed by a task that carries no submit context
    parked.wait(30)
    with pytest.raises(ModelError):
        failing.wait(30)
    submits = {
        (s.attributes or {})["convoq.turn_id"]: f"{s.context.trace_id:032x}"
        for s in spans.get_finished_spans()
        if s.name == "convoq.submit"
    }

    def turns(trace_id: str) -> list[dict[str, Any]]:
        return [
            s
            for s in file_spans(trace_file)
            if s["trace_id"] == trace_id and s["name"] == "convoq.turn"
        ]

    park_runs = wait_until(
        lambda: len(turns(submits[parked.turn_id])) == 2 and turns(submits[parked.turn_id])
    )
    kinds = {s["name"] for s in file_spans(trace_file) if s["trace_id"] == submits[parked.turn_id]}
    assert {"convoq.park", "convoq.tool", "convoq.commit"} <= kinds
    assert all(run["attributes"]["convoq.turn_id"] == parked.turn_id for run in park_runs)
    # The resumed run continues its submit's trace and links to the drain the approval's
    # resume kick started (another trace).
    (resume,) = [s for s in spans.get_finished_spans() if s.name == "convoq.resume"]
    resume_trace = f"{resume.context.trace_id:032x}"

    def drains() -> list[dict[str, Any]]:
        spans_now = file_spans(trace_file)
        return [
            s for s in spans_now if s["trace_id"] == resume_trace and s["name"] == "convoq.drain"
        ]

    # A span is written when it ends, and the drain ends after the turn it ran.
    (drain,) = wait_until(drains, what="the resume kick's drain span")
    resumed = park_runs[-1]
    assert [link["context"]["span_id"].removeprefix("0x") for link in resumed["links"]] == [
        drain["span_id"]
    ]

    (failed,) = wait_until(lambda: turns(submits[failing.turn_id]))
    assert failed["status"]["status_code"] == "ERROR"
    assert any(event["name"] == "exception" for event in failed["events"])
    fail_spans = _tree(file_spans(trace_file), submits[failing.turn_id])
    assert fail_spans["convoq.model"]["status"]["status_code"] == "ERROR"
    assert fail_spans["convoq.fail"]["parent_id"] == failed["span_id"]


def test_the_gateway_serves_its_metrics_to_a_metrics_key_only(
    pool: WorkerPool, tmp_path: Path
) -> None:
    with running_gateway(pool, tmp_path) as gateway:
        with gateway.client("scraper") as scraper:
            before = parse(scraper.get("/metrics").text)
        with gateway.client("admin") as admin:
            cid = _cid("g-metrics")
            answer = admin.post(
                f"/v1/conversations/{cid}/turns", json={"message": "hi", "agent": "echo"}
            )
            assert answer.status_code == 202, answer.text
            with gateway.client(None) as anonymous:
                assert anonymous.get("/metrics").status_code == 401
            with gateway.client("reader") as reader:
                assert reader.get("/metrics").status_code == 403
            with gateway.client("scraper") as scraper:
                response = scraper.get("/metrics")
                # A metrics key reaches no conversation.
                assert scraper.get(f"/v1/conversations/{cid}/messages").status_code == 403
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    after = parse(response.text)
    assert _moved(before, after, "convoq_turns_submitted_total", agent="echo") == 1

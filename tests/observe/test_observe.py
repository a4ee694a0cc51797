"""Metrics and traces in one process: model retries and errors by status, tool calls,
merged multiprocess values, the exposition for the gateway, spans with errors recorded,
and the no-op path without OpenTelemetry."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.trace import StatusCode
from prometheus_client import REGISTRY

from convoq import Agent, Message, ToolCall, tool
from convoq.engine import Completed, TurnLoop
from convoq.errors import ModelHTTPError
from convoq.models import ScriptedModel, openai
from convoq.observe import metrics, tracing
from convoq.queue.routing import partition_of
from convoq.redis._due import Due
from convoq.settings import ConvoqSettings
from convoq.tools import ToolRegistry
from convoq.turn_state import TurnState
from convoq.worker._observed import count_timers, measure_inboxes, serve_metrics
from convoq.worker._timers import TimerPoll
from convoq.worker.profiles import Profiles
from convoq.worker.runner import Runner, RunnerConfig
from convoq.worker.sweeper import Sweeper
from tests.support.models import call_tool_then_answer
from tests.support.openai_server import OpenAIServer
from tests.support.protocol_helpers import open_protocol
from tests.support.telemetry import memory_exporter, parse, value

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as s:
        yield s


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@tool
def explode() -> str:
    """Always fails."""
    raise RuntimeError("tool broke")


def loop_over(model: object, *tools: object) -> TurnLoop:
    return TurnLoop(model=model, tools=ToolRegistry(list(tools)), history=[])  # type: ignore[arg-type]


async def test_model_retries_and_errors_are_counted_by_status(server: OpenAIServer) -> None:
    chat = openai("obs-retry", base_url=server.url, api_key="k", max_retries=2, retry_base_delay=0)
    retries_503 = sample("convoq_model_retries_total", model="obs-retry", status="503")
    retries_500 = sample("convoq_model_retries_total", model="obs-retry", status="500")
    ok = sample("convoq_model_request_seconds_count", model="obs-retry", outcome="ok")
    server.reply_status(503)
    server.reply_status(500)
    server.reply_text("fine")
    async with chat:
        outcome = await loop_over(chat).run(TurnState.start(Message.user("hi")))
    assert isinstance(outcome, Completed)
    assert sample("convoq_model_retries_total", model="obs-retry", status="503") == retries_503 + 1
    assert sample("convoq_model_retries_total", model="obs-retry", status="500") == retries_500 + 1
    assert sample("convoq_model_request_seconds_count", model="obs-retry", outcome="ok") == ok + 1

    errors = sample("convoq_model_errors_total", model="obs-retry", status="429")
    server.reply_status(429, headers={"Retry-After": "0"})
    server.reply_status(429, headers={"Retry-After": "0"})
    server.reply_status(429, headers={"Retry-After": "0"})
    async with chat:
        with pytest.raises(ModelHTTPError):
            await loop_over(chat).run(TurnState.start(Message.user("hi")))
    assert sample("convoq_model_errors_total", model="obs-retry", status="429") == errors + 1


async def test_tool_calls_are_counted_and_a_failing_tool_is_an_error_span() -> None:
    spans = memory_exporter()
    failed = sample("convoq_tool_calls_total", tool="explode", outcome="error")
    model = ScriptedModel(call_tool_then_answer("explode", {}), name="obs-tool")
    with tracing.span("test.root"):
        outcome = await loop_over(model, explode).run(TurnState.start(Message.user("go")))
    assert isinstance(outcome, Completed) and "tool broke" in outcome.text
    assert sample("convoq_tool_calls_total", tool="explode", outcome="error") == failed + 1
    finished = {s.name: s for s in spans.get_finished_spans()}
    root, tool_span = finished["test.root"], finished["convoq.tool"]
    assert tool_span.parent is not None and tool_span.parent.span_id == root.context.span_id
    assert tool_span.status.status_code is StatusCode.ERROR
    assert [e.name for e in tool_span.events] == ["exception"]
    assert (
        tool_span.attributes is not None and tool_span.attributes["gen_ai.tool.name"] == "explode"
    )
    models = [s for s in spans.get_finished_spans() if s.name == "convoq.model"]
    assert len(models) == 2 and all(s.status.status_code is StatusCode.UNSET for s in models)


def test_a_tool_name_made_up_by_the_model_is_not_a_label() -> None:
    before = sample("convoq_tool_calls_total", tool="(unknown)", outcome="error")
    model = ScriptedModel(call_tool_then_answer("no_such_tool_xyz", {}))
    asyncio.run(loop_over(model).run(TurnState.start(Message.user("go"))))
    assert sample("convoq_tool_calls_total", tool="(unknown)", outcome="error") == before + 1
    assert sample("convoq_tool_calls_total", tool="no_such_tool_xyz", outcome="error") == 0


def test_metrics_response_is_the_prometheus_exposition() -> None:
    metrics.turn_submitted("obs-exposition")
    body, content_type = metrics.metrics_response()
    assert content_type.startswith("text/plain")
    samples = parse(body.decode())
    assert value(samples, "convoq_turns_submitted_total", agent="obs-exposition") >= 1


_WRITER = """
from convoq.observe import metrics
metrics.turn_submitted("obs-multi")
metrics.turn_ran("obs-multi", "succeeded", 0.2)
"""
_READER = """
from convoq.observe import metrics
print(metrics.metrics_response()[0].decode())
"""


def test_processes_sharing_a_multiproc_dir_are_scraped_as_one(tmp_path: Path) -> None:
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    for _ in range(2):  # two processes, each gone before the scrape
        subprocess.run([sys.executable, "-c", _WRITER], env=env, check=True, timeout=60)
    out = subprocess.run(
        [sys.executable, "-c", _READER], env=env, check=True, timeout=60, capture_output=True
    ).stdout.decode()
    samples = parse(out)
    assert value(samples, "convoq_turns_submitted_total", agent="obs-multi") == 2
    assert value(samples, "convoq_turns_finished_total", agent="obs-multi", status="succeeded") == 2
    assert (
        value(samples, "convoq_turn_run_seconds_count", agent="obs-multi", outcome="succeeded") == 2
    )


_WITHOUT_OTEL = """
import sys
sys.modules["opentelemetry"] = None  # as if it were not installed
import asyncio
import socket
from convoq import Agent
from convoq.models import ScriptedModel
from convoq.observe import tracing
assert tracing.ENABLED is False
with tracing.span("x", {"a": 1}):
    tracing.record_error(RuntimeError("no-op"))
assert tracing.carrier() == {}
agent = Agent(ScriptedModel.from_replies(["hello"]))
print(agent.generate("hi").text)
assert not any(name.startswith("opentelemetry") for name in sys.modules if sys.modules[name])
"""


def test_without_opentelemetry_everything_runs_and_nothing_is_traced() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OTEL],
        env={"PYTHONPATH": str(ROOT)},
        check=True,
        timeout=60,
        capture_output=True,
    )
    assert out.stdout.decode().strip() == "hello"


_API_ONLY = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from convoq.observe import tracing
parent = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
assert tracing.ENABLED and not tracing.recording()
with tracing.span("x", {"a": 1}, parent=parent):
    assert trace.get_current_span() is trace.INVALID_SPAN  # no span was opened
trace.set_tracer_provider(TracerProvider())
assert tracing.recording()
with tracing.span("x", {"a": 1}, parent=parent):
    span = trace.get_current_span()
    assert span.is_recording()
    assert span.get_span_context().trace_id == 0x0AF7651916CD43DD8448EB211C80319C
print("ok")
"""


def test_with_the_api_but_no_tracer_provider_no_span_is_opened() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _API_ONLY],
        env={"PYTHONPATH": str(ROOT)},
        check=True,
        timeout=60,
        capture_output=True,
    )
    assert out.stdout.decode().strip() == "ok"


def test_a_worker_trace_file_without_the_sdk_is_a_configuration_error(tmp_path: Path) -> None:
    script = (
        "import sys, pathlib; sys.modules['opentelemetry.sdk'] = None\n"
        "from convoq.worker._observed import export_spans\n"
        f"export_spans(pathlib.Path({str(tmp_path / 'spans.jsonl')!r}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env={"PYTHONPATH": str(ROOT)}, capture_output=True
    )
    assert out.returncode != 0
    assert b"ConfigurationError: CONVOQ_TRACE_FILE needs OpenTelemetry" in out.stderr


async def test_the_sweeper_counts_expired_approvals_re_kicks_and_inbox_depths(
    redis_url: str, key_prefix: str
) -> None:
    cid, agent = f"obs-sweep-{key_prefix}", f"obs-sweep-{key_prefix}"
    async with open_protocol(redis_url, key_prefix) as proto:
        for tid in ("t1", "t2", "t3"):
            await proto.submit(cid, tid, agent=agent, message=Message.user(tid), options={})
        acquired = await proto.acquire(cid, worker_id="w", lease_ms=60_000)
        assert acquired is not None
        call = ToolCall(id="c", name="pay")
        state = TurnState(
            messages=[acquired.turn.input, Message.assistant("", tool_calls=[call])],
            steps=1,
            pending=[call],
        )
        # A long approval lifetime, ended below by the test itself (no race with a clock).
        await proto.park(cid, "t1", fence=acquired.fence, state=state, approval_ttl_ms=600_000)
        kicked: list[str] = []

        async def kick(conversation_id: str) -> None:
            kicked.append(conversation_id)

        sweeper = Sweeper(
            proto,
            kick,
            interval_s=60,
            measure=lambda: measure_inboxes(proto.redis, proto.keys, 4),
        )
        before = sample("convoq_sweeper_kicks_total")
        part = str(partition_of(cid, 4))
        # The parked turn holds the conversation (all three queued) until its approval
        # expires; then the conversation is kicked, and the worker ends the turn expired.
        await sweeper.sweep_once()
        assert sample("convoq_inbox_depth", partition=part) >= 3 and kicked == []
        # The parked lease lives exactly as long as the approval may wait: its end is the
        # approval's expiry, ended here by the test (no race with a clock).
        await proto.redis.delete(proto.keys.lease(cid))
        assert await sweeper.sweep_once() == kicked == [cid]
        assert sample("convoq_sweeper_kicks_total") == before + 1
        echo = Agent(ScriptedModel(lambda request: "ok"), name=agent)
        config = RunnerConfig(worker_id="w", lease_ms=60_000)
        report = await Runner(proto, Profiles([echo]), config).drain(cid)
    assert report.expired == ["t1"] and report.succeeded == ["t2", "t3"]
    assert sample("convoq_turns_finished_total", agent=agent, status="expired") == 1


async def test_timers_fired_their_lag_and_the_turns_waiting_are_measured(
    redis_url: str, key_prefix: str
) -> None:
    cid = f"obs-timers-{key_prefix}"
    async with open_protocol(redis_url, key_prefix) as proto:
        seconds, micros = await proto.redis.time()
        now = seconds * 1000 + micros // 1000
        timers = [("late", now - 2000), ("due", now - 50), ("later", now + 600_000)]
        for tid, due_ms in [*timers, ("cancelled", now - 10)]:
            await proto.schedule(
                cid, tid, agent="bot", message=Message.user(tid), options={},
                due=Due(at_ms=due_ms),
            )  # fmt: skip
        # Cancelled with its timer left behind (an older client's cancel): not counted.
        await proto.redis.hset(proto.keys.turn(cid, "cancelled"), "status", "cancelled")
        fired = sample("convoq_timers_fired_total")
        lags = sample("convoq_timer_lag_seconds_count")
        lag_sum = sample("convoq_timer_lag_seconds_sum")
        kicked: list[str] = []

        async def kick(conversation_id: str) -> None:
            kicked.append(conversation_id)

        assert await TimerPoll(proto, kick, interval_s=60).poll_once() == 2
        assert sample("convoq_timers_fired_total") == fired + 2
        assert sample("convoq_timer_lag_seconds_count") == lags + 2
        # By Redis's clock: fired at least 2 s and 50 ms after their due times.
        assert sample("convoq_timer_lag_seconds_sum") >= lag_sum + 2.05
        # What the process that sweeps does after its sweep: one turn still waits.
        count_timers(await proto.repair_timer_index(), 4)
        part = partition_of(cid, 4)
        assert sample("convoq_timers_waiting", partition=str(part)) == 1
        others = [p for p in range(4) if p != part]
        assert [sample("convoq_timers_waiting", partition=str(p)) for p in others] == [0, 0, 0]
        # A process that does not sweep in a period leaves the gauge to the one that does.
        lock = proto.keys.sweeper_lock()
        await proto.redis.set(lock, "another process", px=60_000)
        sweeper = Sweeper(proto, kick, interval_s=60, redis=proto.redis, lock_key=lock)
        assert await sweeper.sweep_once() == []
    assert REGISTRY.get_sample_value("convoq_timers_waiting", {"partition": str(part)}) is None


async def test_the_asgi_app_answers_a_scrape() -> None:
    metrics.turn_submitted("obs-asgi")
    transport = httpx.ASGITransport(app=metrics.asgi_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://metrics") as http:
        response = await http.get("/metrics")
    assert response.status_code == 200
    assert value(parse(response.text), "convoq_turns_submitted_total", agent="obs-asgi") >= 1


def test_workers_serve_no_metrics_unless_a_port_is_set() -> None:
    assert serve_metrics(ConvoqSettings()) is None
    server = serve_metrics(ConvoqSettings(metrics_port=0, metrics_host="127.0.0.1"))
    assert server is not None
    try:
        answer = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10)
        assert "convoq_turns_started_total" in answer.text
    finally:
        server.close()


def _answers_on(address: str, port: int) -> bool:
    """Whether something accepts connections on ``address:port`` (all of 127.0.0.0/8 is
    this machine: a socket bound to 0.0.0.0 answers on 127.0.0.2, one bound to 127.0.0.1
    does not)."""
    with socket.socket() as probe:
        probe.settimeout(5)
        return probe.connect_ex((address, port)) == 0


@pytest.mark.parametrize(
    ("configured", "elsewhere"), [(None, False), ("0.0.0.0", True), ("127.0.0.1", False)]
)
def test_worker_metrics_listen_on_loopback_unless_a_host_is_configured(
    configured: str | None, elsewhere: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONVOQ_METRICS_HOST", raising=False)
    if configured is not None:
        monkeypatch.setenv("CONVOQ_METRICS_HOST", configured)
    monkeypatch.setenv("CONVOQ_METRICS_PORT", "0")
    server = serve_metrics(ConvoqSettings.resolve())  # as the worker starts it
    assert server is not None
    try:
        assert (
            "convoq_turns_started_total"
            in httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
        )
        assert _answers_on("127.0.0.2", server.port) is elsewhere
    finally:
        server.close()


def test_metric_children_are_kept_up_to_a_bound_and_count_beyond_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics, "_children", {})
    monkeypatch.setattr(metrics, "_MAX_CHILDREN", 3)
    names = [f"bounded-tool-{n}" for n in range(6)]
    for name in names * 2:
        metrics.tool_called(name, "ok")
    assert len(metrics._children) == 3
    for name in names:
        counted = REGISTRY.get_sample_value(
            "convoq_tool_calls_total", {"tool": name, "outcome": "ok"}
        )
        assert counted == 2

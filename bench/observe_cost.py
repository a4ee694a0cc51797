"""What metrics and traces cost per turn: the in-process turn loop (one model call, one
tool call, a second model call; scripted model, no I/O) timed in three processes:

- without OpenTelemetry importable (the spans are no-ops; metrics still count);
- with ``opentelemetry-api`` installed and no SDK configured (non-recording spans);
- with the SDK recording every span into a batch processor whose exporter drops them;

and, alone, the Prometheus updates a worker makes for such a turn.

Each figure is the median of many turns; the difference between columns is the price of
the spans. Run ``python -m bench observe`` (or ``python -m bench.observe_cost``).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TURNS = 1500
ROUNDS = 5

_BODY = """
import asyncio, json, statistics, sys, time
MODE = sys.argv[1]
if MODE == "absent":
    sys.modules["opentelemetry"] = None
if MODE == "sdk":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)
from convoq import Message, ToolCall, tool
from convoq.engine import TurnLoop
from convoq.models import ScriptedModel
from convoq.tools import ToolRegistry
from convoq.turn_state import TurnState

def call_tool_then_answer(request):
    if request.messages[-1].role == "tool":
        return "tool said " + request.messages[-1].text
    call = ToolCall(id="c1", name="double", arguments={"n": 2})
    return Message.assistant("", [call])

@tool
def double(n: int) -> int:
    "Twice n."
    return 2 * n

async def run(turns):
    times = []
    for _ in range(turns):
        model = ScriptedModel(call_tool_then_answer)
        loop = TurnLoop(model=model, tools=ToolRegistry([double]), history=[])
        start = time.perf_counter()
        await loop.run(TurnState.start(Message.user("go")))
        times.append(time.perf_counter() - start)
    return times

asyncio.run(run(200))  # warm up
print(json.dumps(statistics.median(asyncio.run(run(int(sys.argv[2])))) * 1e6))
"""


def _median_us(mode: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _BODY, mode, str(TURNS)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        check=True,
        capture_output=True,
        timeout=600,
    )
    return float(json.loads(out.stdout))


def _metrics_us(rounds: int = 20_000) -> float:
    """The metric updates a worker makes for such a turn, alone (median over batches)."""
    import time

    from convoq.observe import metrics

    samples = []
    for _ in range(20):
        start = time.perf_counter()
        for _ in range(rounds // 20):
            metrics.turn_started("bench", 0.01)
            metrics.model_request("bench-model", 0.001)
            metrics.tool_called("double", "ok")
            metrics.model_request("bench-model", 0.001)
            metrics.turn_ran("bench", "succeeded", 0.002)
        samples.append((time.perf_counter() - start) / (rounds // 20))
    return statistics.median(samples) * 1e6


def main() -> None:
    # Interleaved rounds, so load on the machine hits every column alike.
    runs: dict[str, list[float]] = {"absent": [], "api": [], "sdk": []}
    for _ in range(ROUNDS):
        for mode, figures in runs.items():
            figures.append(_median_us(mode))
    absent, api, sdk = (statistics.median(runs[m]) for m in ("absent", "api", "sdk"))
    print(f"turn loop, 2 model calls + 1 tool call, median of {ROUNDS} x {TURNS} turns:")
    print(f"  OpenTelemetry absent:       {absent:8.1f} µs/turn")
    print(f"  API only (no SDK):          {api:8.1f} µs/turn ({api - absent:+.1f})")
    print(f"  SDK recording 3 spans/turn: {sdk:8.1f} µs/turn ({sdk - absent:+.1f})")
    print(f"metric updates of such a turn on a worker: {_metrics_us():.1f} µs/turn")


if __name__ == "__main__":
    main()

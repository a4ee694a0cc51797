"""Run benchmarks by name: ``python -m bench [--quick] [NAME ...]`` (no name: all of them).

``--quick`` (or ``BENCH_QUICK=1``) runs fewer rounds where a benchmark offers it, for
iterating. Each benchmark's output starts and ends with the machine's load average."""

from __future__ import annotations

import importlib
import os
import sys

from bench._harness import load_line

# name -> module with a ``main() -> None``. Add a line here to register a benchmark.
BENCHMARKS: dict[str, str] = {
    "compare": "bench.compare",
    "memory": "bench.memory_append",
    "window": "bench.memory_window",
    "turns": "bench.turn_latency",
    "hop": "bench.sync_hop",
    "blocking": "bench.blocking_models",
    "gateway": "bench.gateway_latency",
    "observe": "bench.observe_cost",
    "writer": "bench.agent_writer",
    "scaling": "bench.scaling",
    "acks": "bench.durable_acks",
    "cost": "bench.turn_cost",
    "fair": "bench.fair_slots",
    "langchain": "bench.langchain_window",
    "gc": "bench.gc_decode",
    "fastpaths": "bench.fast_paths",
    "history": "bench.history_route",
    "console": "bench.console_open",
}


def main(argv: list[str]) -> int:
    if "--quick" in argv:
        os.environ["BENCH_QUICK"] = "1"
    names = [name for name in argv if name != "--quick"] or list(BENCHMARKS)
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark {', '.join(unknown)}; choose from: {', '.join(BENCHMARKS)}")
        return 2
    for name in names:
        print(f"== {name} ({BENCHMARKS[name]})", flush=True)
        print(load_line("start"), flush=True)
        importlib.import_module(BENCHMARKS[name]).main()
        print(load_line("end"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

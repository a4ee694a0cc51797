"""Prometheus metrics of convoq, and the ways to expose them.

Every process that runs convoq code updates the metrics below in ``prometheus_client``'s
default registry: a client (or the gateway that holds one) counts submitted turns, a
worker everything else. A worker serves them over HTTP when ``CONVOQ_METRICS_PORT`` is set
(:func:`serve`); the gateway mounts :func:`asgi_app` or answers with
:func:`metrics_response`.

Processes that fork (Celery's prefork pool, gunicorn) must share their values through
files: set ``PROMETHEUS_MULTIPROC_DIR`` to an empty, writable directory in the environment
of the parent before it starts (``prometheus_client`` then keeps every value in
memory-mapped files there), and every exposition here merges all processes' files; call
``prometheus_client.multiprocess.mark_process_dead(pid)`` when a child exits (gunicorn's
``child_exit`` hook) so its inbox depth stops counting. convoq workers run the ``threads``
pool in one process, so they need none of this by default.

Labels stay bounded: agent profile names, model names, outcomes and HTTP statuses;
never conversation or turn ids.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    make_asgi_app,
    multiprocess,
    start_http_server,
)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Turns wait from milliseconds (an idle worker) to hours (a backlog); runs last seconds
# to minutes (model calls and tools).
_WAIT_BUCKETS = (0.005, 0.025, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
_RUN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)

TURNS_SUBMITTED = Counter(
    "convoq_turns_submitted_total", "Turns queued by clients (duplicates not counted).", ["agent"]
)
SUBMITS_REFUSED = Counter(
    "convoq_submits_refused_total",
    "Submits refused by a limit on queued turns (conversation, agent, total).",
    ["agent", "limit"],
)
TURNS_STARTED = Counter(
    "convoq_turns_started_total",
    "Runs of a turn begun on a worker (resumes, reruns too).",
    ["agent"],
)
TURNS_FINISHED = Counter(
    "convoq_turns_finished_total",
    "Turns that ended, by status: succeeded, failed, cancelled, expired (approval),"
    " blocked (guardrail).",
    ["agent", "status"],
)
TURNS_PARKED = Counter(
    "convoq_turns_parked_total", "Turns parked to wait for tool-call approvals.", ["agent"]
)
TURNS_ABANDONED = Counter(
    "convoq_turns_abandoned_total",
    "Runs given up without a write (lease lost, Redis unavailable): the turn runs again.",
    ["agent"],
)
QUEUE_WAIT = Histogram(
    "convoq_turn_queue_wait_seconds",
    "From submit to the first run of a turn on a worker.",
    ["agent"],
    buckets=_WAIT_BUCKETS,
)
RUN_TIME = Histogram(
    "convoq_turn_run_seconds",
    "One run of a turn on a worker, by how it ended.",
    ["agent", "outcome"],
    buckets=_RUN_BUCKETS,
)
MODEL_LATENCY = Histogram(
    "convoq_model_request_seconds",
    "One model request as the turn loop sees it (retries included), by outcome.",
    ["model", "outcome"],
    buckets=_RUN_BUCKETS,
)
MODEL_ERRORS = Counter(
    "convoq_model_errors_total",
    "Model requests that failed, by HTTP status (or error type without one).",
    ["model", "status"],
)
MODEL_RETRIES = Counter(
    "convoq_model_retries_total",
    "Attempts of a model request retried, by what the failed attempt got.",
    ["model", "status"],
)
MODEL_TOKENS = Counter(
    "convoq_model_tokens_total",
    "Tokens the model endpoints reported, by kind: input, output, and the cached part of"
    " input and reasoning part of output; counted where a response carries usage.",
    ["model", "kind"],
)
TOOL_CALLS = Counter(
    "convoq_tool_calls_total",
    "Tool calls run by turns, by outcome (ok, error, denied).",
    ["tool", "outcome"],
)
TOOL_ERRORS = Counter(
    "convoq_tool_errors_total",
    "Tool calls that raised (or whose MCP server answered isError), by agent profile and"
    " tool; each is logged with its ids by the convoq.tools logger.",
    ["agent", "tool"],
)
GUARDRAIL_TRIPS = Counter(
    "convoq_guardrail_trips_total",
    "Guardrails that tripped and ended a turn as blocked, by agent profile, guardrail and"
    " kind (input, output).",
    ["agent", "guardrail", "kind"],
)
LEASE_RENEWALS = Counter("convoq_lease_renewals_total", "Leases renewed while a turn ran.")
LEASE_RENEWAL_ERRORS = Counter(
    "convoq_lease_renewal_errors_total", "Lease renewals that failed and were retried."
)
LEASES_LOST = Counter(
    "convoq_leases_lost_total", "Turns abandoned because their conversation's lease was lost."
)
SWEEPER_KICKS = Counter(
    "convoq_sweeper_kicks_total", "Conversations re-kicked by the sweeper (queued, no lease)."
)
SWEEPER_KICKS_HELD = Counter(
    "convoq_sweeper_kicks_held_total",
    "Re-kicks the sweeper held back: the conversation's head waits with no lease, and the"
    " backoff since the sweeper last kicked that same head has not passed.",
)
SWEEPER_KICK_ERRORS = Counter(
    "convoq_sweeper_kick_errors_total",
    "Kicks of the sweeper that could not be sent (the broker refused or was away); each is"
    " logged, the pass goes on, and the next pass kicks that conversation again.",
)
INBOX_DEPTH = Gauge(
    "convoq_inbox_depth",
    "Turns queued or running per partition, as the last sweep saw them (only the process"
    " that swept last reports it: use max by (partition)).",
    ["partition"],
    multiprocess_mode="livemostrecent",
)
TIMERS_FIRED = Counter(
    "convoq_timers_fired_total",
    "Scheduled turns that joined their conversation's line when due (each timer fires once"
    " across workers; a cancelled turn's timer is not counted).",
)
# A timer is queued within a poll interval (0.5 s by default) of its due time; later
# means the workers are behind or Redis was away.
_LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
TIMER_LAG = Histogram(
    "convoq_timer_lag_seconds",
    "From a scheduled turn's due time to its joining the line, by Redis's clock.",
    buckets=_LAG_BUCKETS,
)
TIMERS_WAITING = Gauge(
    "convoq_timers_waiting",
    "Scheduled turns waiting for their time per partition, as the last sweep's repair of"
    " the timer index saw them (only the process that swept last reports it: use max by"
    " (partition)).",
    ["partition"],
    multiprocess_mode="livemostrecent",
)
WEBHOOKS = Counter(
    "convoq_webhook_deliveries_total",
    "Webhook POST attempts by outcome: delivered, retry, rejected, given_up.",
    ["outcome"],
)
# Hot Redis commands sent directly: a round trip on a local network is 0.1-1 ms.
_REDIS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1)
REDIS_DIRECT = Histogram(
    "convoq_redis_direct_seconds",
    "Hot Redis commands convoq sends itself, bypassing redis-py (CONVOQ_FAST_PATHS), by"
    " kind: read (plain reads in one batch), script (EVALSHA); one round trip each.",
    ["kind"],
    buckets=_REDIS_BUCKETS,
)
REDIS_DIRECT_FALLBACKS = Counter(
    "convoq_redis_direct_fallbacks_total",
    "Hot Redis commands handed to redis-py instead, by reason: noscript (it loads the"
    " script), argument (it encodes it), connection (it reconnects and retries).",
    ["reason"],
)


# Children of the per-turn metrics, by metric and label values: ``labels()`` takes a lock
# and checks every value each time (3-5 µs; a turn updates five to eight). None of these
# metrics is ever cleared, and their labels are few (see the module docstring); the cache
# stops growing at _MAX_CHILDREN all the same.
_children: dict[tuple[object, ...], Any] = {}
_MAX_CHILDREN = 4096


def _child(metric: Counter | Histogram, *values: str) -> Any:
    key = (metric, *values)
    child = _children.get(key)
    if child is None:
        child = metric.labels(*values)
        if len(_children) < _MAX_CHILDREN:
            _children[key] = child
    return child


def turn_submitted(agent: str) -> None:
    _child(TURNS_SUBMITTED, agent).inc()


def submit_refused(agent: str, limit: str) -> None:
    """A submit over a limit on queued turns (QueueFullError)."""
    SUBMITS_REFUSED.labels(agent, limit).inc()


# Bound once: on a call of a few hundred µs, looking the labels up again costs 3 µs more.
_REDIS_DIRECT_KINDS = {kind: REDIS_DIRECT.labels(kind) for kind in ("read", "script")}


def redis_direct_call(kind: str, seconds: float) -> None:
    """One hot command batch sent directly (``kind``: read or script)."""
    _REDIS_DIRECT_KINDS[kind].observe(seconds)


def redis_direct_fallback(reason: str) -> None:
    REDIS_DIRECT_FALLBACKS.labels(reason).inc()


def turn_started(agent: str, queue_wait_s: float | None) -> None:
    """A run begins; ``queue_wait_s`` for its first run only (None for reruns, resumes)."""
    _child(TURNS_STARTED, agent).inc()
    if queue_wait_s is not None:
        _child(QUEUE_WAIT, agent).observe(max(0.0, queue_wait_s))


def turn_ran(agent: str, outcome: str, seconds: float) -> None:
    """A run ended with ``outcome``: succeeded, failed, cancelled, expired, parked or
    abandoned."""
    _child(RUN_TIME, agent, outcome).observe(seconds)
    if outcome == "parked":
        TURNS_PARKED.labels(agent).inc()
    elif outcome == "abandoned":
        TURNS_ABANDONED.labels(agent).inc()
    else:
        _child(TURNS_FINISHED, agent, outcome).inc()


def turn_finished(agent: str, status: str) -> None:
    """A turn ended without running here (over max attempts)."""
    TURNS_FINISHED.labels(agent, status).inc()


def model_request(model: str, seconds: float, error: BaseException | None = None) -> None:
    """One request of the turn loop to its model (``error``: what it raised)."""
    _child(MODEL_LATENCY, model, "ok" if error is None else "error").observe(seconds)
    if error is not None:
        MODEL_ERRORS.labels(model, error_status(error)).inc()


def model_retry(model: str, status: str) -> None:
    MODEL_RETRIES.labels(model, status).inc()


def tokens_used(model: str, counts: dict[str, int]) -> None:
    """Count the usage one model response reported: ``{kind: tokens}`` (input, output and
    the parts of them that were cached or reasoning)."""
    for kind, tokens in counts.items():
        if tokens > 0:
            _child(MODEL_TOKENS, model, kind).inc(tokens)


def tool_called(tool: str, outcome: str) -> None:
    _child(TOOL_CALLS, tool, outcome).inc()


def tool_failed(agent: str, tool: str) -> None:
    """A tool call raised, or reported an error (``agent``: '' for an unnamed Agent)."""
    _child(TOOL_ERRORS, agent, tool).inc()


def guardrail_tripped(agent: str, guardrail: str, kind: str) -> None:
    """A guardrail ended a turn as blocked (``agent``: '' for an unnamed Agent)."""
    _child(GUARDRAIL_TRIPS, agent, guardrail, kind).inc()


def error_status(error: BaseException) -> str:
    """An error's label: its HTTP status if it has one (``ModelHTTPError``), else its type
    name (``ModelError`` for a transport failure or an unusable answer)."""
    status = getattr(error, "status_code", None)
    return str(status) if isinstance(status, int) else type(error).__name__


def inbox_depths(depths: dict[int, int], partitions: int) -> None:
    """Set the depth of every partition (0 where nothing waits)."""
    for partition in range(partitions):
        INBOX_DEPTH.labels(str(partition)).set(depths.get(partition, 0))


def inbox_depths_unknown() -> None:
    """This process did not sweep: leave the depth to the one that did."""
    INBOX_DEPTH.clear()


def timers_fired(lags_ms: tuple[int, ...]) -> None:
    """Turns queued by one fire of a conversation's timers, each ``lags_ms`` after its
    due time."""
    if lags_ms:
        TIMERS_FIRED.inc(len(lags_ms))
        for lag in lags_ms:
            TIMER_LAG.observe(max(0, lag) / 1000)


def timers_waiting(counts: dict[int, int], partitions: int) -> None:
    """Set the scheduled turns waiting in every partition (0 where none waits)."""
    for partition in range(partitions):
        TIMERS_WAITING.labels(str(partition)).set(counts.get(partition, 0))


def timers_waiting_unknown() -> None:
    """This process did not sweep: leave the timers waiting to the one that did."""
    TIMERS_WAITING.clear()


def registry() -> CollectorRegistry:
    """The registry to expose: every process's values under ``PROMETHEUS_MULTIPROC_DIR``
    when it is set, else this process's."""
    if not os.environ.get(MULTIPROC_ENV):
        return REGISTRY
    merged = CollectorRegistry()
    multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
    return merged


def metrics_response() -> tuple[bytes, str]:
    """The body and content type of one scrape (for any web framework)."""
    return generate_latest(registry()), CONTENT_TYPE_LATEST


def asgi_app() -> Callable[..., Any]:
    """An ASGI app answering scrapes (mount it at ``/metrics``)."""
    return make_asgi_app(registry())


@dataclass
class MetricsServer:
    """The HTTP server of :func:`serve`; ``port`` is the one it listens on."""

    server: WSGIServer
    thread: threading.Thread
    port: int

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve scrapes on ``host:port`` (port 0: a free one) in a daemon thread; loopback
    unless another host is given (the endpoint has no auth)."""
    server, thread = start_http_server(port, addr=host, registry=registry())
    return MetricsServer(server, thread, int(server.server_address[1]))

"""``ConvoqSettings``: every ``CONVOQ_*`` environment variable, and the one way every
entry point resolves a setting (:meth:`ConvoqSettings.resolve`): an explicit argument,
else the ``CONVOQ_*`` variable, else the embedded default from :mod:`convoq.defaults`.
``Client()``, ``AsyncClient()``, ``RedisConversationMemory()``, the worker and the CLI all
go through it, so a client and a worker started in one environment agree.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from convoq import defaults
from convoq.errors import ConfigurationError

GatewayScope = Literal["submit", "read", "approve", "admin", "metrics"]
PoolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
"""A worker pool's name: it is part of its queues' names."""


class GatewayKey(BaseModel):
    """One API key of the HTTP gateway: what it may do, and on which conversations."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: SecretStr = Field(min_length=16, description="The bearer token (16+ characters).")
    scopes: tuple[GatewayScope, ...] = Field(min_length=1)
    conversation_prefix: str = Field(
        default="", max_length=256, description="Only conversation ids starting with this."
    )
    name: str = Field(default="", max_length=100, description="Shown in logs, never the key.")
    may_set_by: bool = Field(
        default=False,
        description="May name who decided an approval (`by`), for an app deciding for its"
        " signed-in users; otherwise a decision records the key's name.",
    )


class ConvoqSettings(BaseSettings):
    """Configuration from the environment (prefix ``CONVOQ_``) or keyword arguments."""

    model_config = SettingsConfigDict(env_prefix="CONVOQ_", extra="ignore")

    redis_url: str | None = Field(
        default=None,
        description="Redis for memory and the turn protocol (redis://, rediss://, unix://,"
        " redis+cluster://host:port,... for a Redis Cluster, or"
        " redis+sentinel://host:port,.../service_name/db for a Redis served by Sentinel);"
        " redis-py options may follow (?socket_timeout=5), for the broker too."
        " Unset: an embedded redis-server under `home`.",
    )
    broker_url: str | None = Field(
        default=None,
        description="Celery broker; defaults to redis_url (amqp:// works too). Required"
        " when redis_url is a cluster. A Redis broker URL's redis-py options go to kombu's"
        " transport options.",
    )
    prefix: str = Field(default=defaults.PREFIX, description="Prefix of every Redis key.")
    home: Path = Field(default=defaults.HOME, description="Where the embedded Redis lives.")
    partitions: int = Field(
        default=defaults.PARTITIONS, ge=1, le=1024, description="Queues convoq.p0..p{N-1}."
    )
    agents: str | None = Field(default=None, description="Module with the agent profiles.")
    concurrency: int = Field(
        default=defaults.CONCURRENCY, ge=1, description="Turns in flight per worker process."
    )
    lease_ms: int = Field(
        default=defaults.LEASE_MS, ge=500, description="Lease TTL; renewed while a turn runs."
    )
    max_turn_s: float = Field(
        default=defaults.MAX_TURN_S,
        gt=0,
        description="A turn running longer is stopped and failed (TurnDeadlineError).",
    )
    shutdown_grace_s: float = Field(
        default=defaults.SHUTDOWN_GRACE_S,
        ge=0,
        description="Warm shutdown: running turns may finish this long, then are handed back.",
    )
    sweep_interval_s: float = Field(
        default=defaults.SWEEP_INTERVAL_S, gt=0, description="Sweeper period."
    )
    timer_interval_s: float = Field(
        default=defaults.TIMER_INTERVAL_S,
        gt=0,
        le=60,
        description="How often each worker fires the timers of scheduled turns that are"
        " due: a scheduled turn joins its conversation's line at most this late.",
    )
    max_attempts: int = Field(
        default=defaults.MAX_ATTEMPTS,
        ge=1,
        description="Runs of a turn whose worker died (never came back) before it fails.",
    )
    max_cut_offs: int = Field(
        default=defaults.MAX_CUT_OFFS,
        ge=1,
        description="Runs of a turn cut off from Redis (its worker lost the lease and came"
        " back) before it fails; apart from max_attempts.",
    )
    approval_ttl_s: int = Field(
        default=defaults.APPROVAL_TTL_S, ge=1, description="Parked approvals expire."
    )
    turn_ttl_s: int = Field(
        default=defaults.TURN_TTL_S, ge=60, description="Finished turn records expire."
    )
    signal_max_kept: int = Field(
        default=defaults.SIGNAL_MAX_KEPT,
        ge=1,
        description="Signals of one name a conversation keeps for its next wait on it.",
    )
    signal_ttl_s: int = Field(
        default=defaults.SIGNAL_TTL_S, ge=1, description="A kept signal expires."
    )
    subagent_max_depth: int = Field(
        default=defaults.SUBAGENT_MAX_DEPTH,
        ge=1,
        description="How deep sub-agent calls may nest (1: a sub-agent calls none); a"
        " deeper call is refused with a tool error the model reads.",
    )
    subagent_max_fanout: int = Field(
        default=defaults.SUBAGENT_MAX_FANOUT,
        ge=1,
        description="Sub-agent calls one model step may make; a step asking for more has"
        " them all refused with a tool error the model reads.",
    )
    max_handoffs: int = Field(
        default=defaults.MAX_HANDOFFS,
        ge=1,
        description="Handoffs one turn may make; one past it is refused with a tool error"
        " the model reads.",
    )
    agent_pools: dict[str, PoolName] = Field(
        default_factory=dict,
        description="The pool of workers that serves each agent profile named here"
        " (a JSON object, agent -> pool): its turns are kicked on that pool's queues"
        " ({prefix}.{pool}.p{n}); an agent not named goes to the default queues.",
    )
    pool: PoolName | None = Field(
        default=None,
        description="The pool this worker is: it consumes {prefix}.{pool}.p{n} instead of"
        " the default queues {prefix}.p{n}.",
    )
    conversation_ttl_s: int | None = Field(
        default=defaults.CONVERSATION_TTL_S,
        ge=1,
        description="Idle TTL of a conversation, refreshed by each turn (unset: no expiry).",
    )
    max_queued_per_conversation: int | None = Field(
        default=defaults.MAX_QUEUED_PER_CONVERSATION,
        ge=0,
        description="Turns one conversation may have waiting (0: no limit).",
    )
    max_queued_per_agent: int | None = Field(
        default=defaults.MAX_QUEUED_PER_AGENT,
        ge=0,
        description="Turns queued, running or parked per agent profile (0/unset: no limit).",
    )
    max_queued_total: int | None = Field(
        default=defaults.MAX_QUEUED_TOTAL,
        ge=0,
        description="Turns queued, running or parked in the deployment (0/unset: no limit).",
    )
    min_replicas_acked: int = Field(
        default=defaults.MIN_REPLICAS_ACKED,
        ge=0,
        description="Replicas that must have a submit, commit, fail or park (Redis WAIT) before it"
        " is acknowledged; fewer in time: NotDurableError. 0: the primary's word suffices.",
    )
    replica_ack_timeout_ms: int = Field(
        default=defaults.REPLICA_ACK_TIMEOUT_MS,
        ge=1,
        description="How long a write waits for min_replicas_acked replicas.",
    )
    redis_socket_timeout_s: float | None = Field(
        default=None,
        ge=0,
        description="Seconds a Redis (or Redis broker) reply may take before its connection"
        " counts as dead: the call is sent again on a new connection until twice this has"
        " passed, then it fails. Unset: a quarter of a lease period (lease_ms; at least 1 s,"
        " and 1 s above replica_ack_timeout_ms); 0: no limit. socket_timeout in the URL wins.",
    )
    redis_connect_timeout_s: float | None = Field(
        default=None,
        ge=0,
        description="Seconds a connect to Redis (or a Redis broker) may take. Unset: a quarter"
        " of a lease period (at least 1 s); 0: the system's limit. socket_connect_timeout in"
        " the URL wins.",
    )
    redis_health_check_interval_s: float | None = Field(
        default=None,
        ge=0,
        description="A Redis connection idle this long is checked (PING) before its next"
        " command; the broker also drops a consumer connection whose reply is this overdue."
        " Unset: a quarter of a lease period (at least 1 s); 0: off. health_check_interval in"
        " the URL wins.",
    )
    redis_socket_keepalive: bool = Field(
        default=True,
        description="TCP keepalive on Redis and broker connections: probes after one socket"
        " timeout idle, then every half of it; two unanswered probes drop the connection."
        " socket_keepalive in the URL wins.",
    )
    max_attachment_bytes: int = Field(default=defaults.MAX_ATTACHMENT_BYTES, ge=1)
    max_turn_bytes: int = Field(default=defaults.MAX_TURN_BYTES, ge=1)
    decoded_cache_bytes: int = Field(
        default=defaults.DECODED_CACHE_BYTES,
        ge=0,
        description="Decoded stored turns a process keeps, in bytes (an estimate), so reading"
        " turns it read before decodes nothing again; their messages are then shared"
        " read-only values. One cache per process, read at its first decode. 0: none kept.",
    )
    delta_flush_ms: int = Field(
        default=defaults.DELTA_FLUSH_MS,
        ge=0,
        description="Streamed text waits at most this long for more before it goes to the"
        " turn's event stream as one text_delta event (what an SSE reader waits at most for"
        " the first text). 0: each delta is sent at once.",
    )
    delta_flush_bytes: int = Field(
        default=defaults.DELTA_FLUSH_BYTES,
        ge=1,
        description="Streamed text of this many bytes goes to the event stream at once,"
        " without waiting for delta_flush_ms.",
    )
    webhook_secret: str | None = Field(default=None, description="HMAC key for callbacks.")
    webhook_max_retries: int = Field(default=8, ge=0)
    webhook_retry_base_s: float = Field(
        default=2.0, gt=0, description="First webhook retry delay; doubles per retry."
    )
    webhook_timeout_s: float = Field(default=10.0, gt=0, description="Per webhook POST.")
    webhook_redeliver_after_s: float = Field(
        default=120.0,
        gt=0,
        description="A callback still owed this long after its delivery was due (its"
        " worker died holding it) is sent again by the sweeper.",
    )
    callback_allowed_networks: str | None = Field(
        default=None,
        description="Networks callbacks may go to although not public (comma separated,"
        " e.g. 10.0.0.0/8,127.0.0.1). Unset: public addresses only.",
    )
    mcp_allowed_networks: str | None = Field(
        default=None,
        description="Networks MCP servers over HTTP may be reached in although not public"
        " (comma separated, e.g. 10.0.0.0/8,127.0.0.1). Unset: public addresses only.",
    )
    visibility_timeout_s: int = Field(
        default=defaults.VISIBILITY_TIMEOUT_S,
        ge=60,
        description="Redis broker with the fast paths off: an unacked task is redelivered"
        " after this long (on, kombu keeps no unacked note). Crash recovery does not wait"
        " for it (the sweeper re-kicks after lease_ms).",
    )
    fast_paths: bool = Field(
        default=defaults.FAST_PATHS,
        description="convoq's shortcuts into redis-py, kombu and Celery internals: hot Redis"
        " commands sent directly, kicks pushed by the submit script, the worker's own line."
        " off/0/false: redis-py, send_task and the broker do all of it (slower, same results).",
    )
    task_events: bool = Field(
        default=defaults.TASK_EVENTS,
        description="Celery task events from the start (clients send task-sent too). Off by"
        " default: Flower turns them on in running workers (its enable_events broadcast).",
    )
    gateway_api_keys: list[GatewayKey] = Field(
        default_factory=list,
        description='API keys of `convoq gateway`, as JSON: [{"key": "...", "scopes":'
        ' ["submit", "read"], "conversation_prefix": "tenant-a:"}]. No keys: every'
        " request is refused.",
    )
    model_prices: dict[str, Any] = Field(
        default_factory=dict,
        description='US dollars per million tokens by model name, as JSON: {"gpt-4o":'
        ' {"input": 2.5, "output": 10, "cached_input": 1.25}, "claude-*": {...}} (a'
        " trailing * prices a prefix). The console shows costs from it. Unset: tokens only.",
    )
    gateway_host: str = Field(default="127.0.0.1", description="`convoq gateway` listens here.")
    gateway_port: int = Field(default=8000, ge=1, le=65535)
    flower_port: int = Field(default=5555, ge=1, le=65535)
    flower_basic_auth: str | None = Field(
        default=None,
        description="user:password for `convoq flower` (comma separated for several users).",
    )

    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Workers serve Prometheus metrics on this port (0: any free port, shown"
        " in the worker's entry, Client.workers()). Unset: no metrics endpoint.",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="Address the metrics port binds. Loopback unless set: the endpoint has no"
        " auth, so reaching it from other hosts (0.0.0.0, as the Kubernetes and compose files"
        " set) is a choice made where the network is trusted.",
    )
    trace_file: Path | None = Field(
        default=None,
        description="Workers append their OpenTelemetry spans to this file as JSON lines"
        " (needs convoq[otel]; for tests and debugging).",
    )

    @classmethod
    def resolve(cls, **explicit: Any) -> Self:
        """The settings an entry point runs with: each explicit argument that is not None,
        else its ``CONVOQ_*`` variable, else the embedded default.

        Raises:
            ConfigurationError: a value (given or from the environment) is invalid; every
                problem is named with the variable that sets it.
        """
        given = {name: value for name, value in explicit.items() if value is not None}
        unknown = sorted(set(given) - set(cls.model_fields))
        if unknown:
            raise ConfigurationError(f"unknown settings {unknown}", unknown=unknown)
        try:
            return cls(**given)
        except ValidationError as exc:
            problems = [
                f"{_variable(problem['loc'])}: {problem['msg']}" for problem in exc.errors()
            ]
            raise ConfigurationError(
                "invalid settings: " + "; ".join(problems), problems=problems
            ) from None
        except SettingsError as exc:
            # A list or object setting whose variable is not JSON fails while it is read,
            # before validation: name the variable all the same.
            found = re.search(r'field "(\w+)"', str(exc))
            variable = _variable((found.group(1),)) if found else "a CONVOQ_* variable"
            problem = (
                f"{variable}: not valid JSON ({exc.__cause__}); give lists and objects as JSON"
            )
            raise ConfigurationError(f"invalid settings: {problem}", problems=[problem]) from None

    @property
    def effective_broker_url(self) -> str | None:
        return self.broker_url or self.redis_url


FAST_PATHS_VARIABLE = "CONVOQ_FAST_PATHS"


def fast_paths(explicit: bool | None = None) -> bool:
    """Whether convoq may use its shortcuts into other libraries' internals, resolved as
    every setting: ``explicit`` (an entry point's resolved ``ConvoqSettings.fast_paths``),
    else ``CONVOQ_FAST_PATHS``, else on. For the parts that are built without settings
    at hand (the store's script runner); cheap enough to ask per connection.

    Each shortcut is also on only inside the library releases it was checked with (its
    module's ``CHECKED_WITH``, see :func:`fast_path`). The shortcuts, each in one module:
    :mod:`convoq.redis._pipelined` (hot commands on redis-py's connections),
    :func:`convoq.queue.transport.kick_message` (the kombu message the submit script
    pushes), :mod:`convoq.worker._fair` (the threads pool's queue as the process's own
    line, Celery's worker state), :mod:`convoq.worker._direct` (kicks started from the
    consumer).

    Raises:
        ConfigurationError: ``CONVOQ_FAST_PATHS`` is not a boolean (on/off, 1/0, true/false).
    """
    if explicit is not None:
        return explicit
    return _fast_paths_from(os.environ.get(FAST_PATHS_VARIABLE))


def fast_path(
    name: str, checked_with: Sequence[tuple[str, str]], explicit: bool | None = None
) -> bool:
    """Whether the fenced shortcut ``name`` is on: the switch is on (:func:`fast_paths`)
    and every library it leans on is installed in a release it was checked with
    (``checked_with``: ``(distribution, specifier)`` pairs, its module's ``CHECKED_WITH``,
    read at each call). Outside them the shortcut turns itself off, and says so once per
    process in a warning; the switch off decides first and logs nothing."""
    if not fast_paths(explicit):
        return False
    outside = [_outside(package, spec) for package, spec in checked_with]
    found = [problem for problem in outside if problem]
    if not found:
        return True
    with _WARNED_LOCK:
        first = name not in _WARNED
        _WARNED.add(name)
    if first:
        _log.warning(
            "fast path %s is off: %s; the library's public API is used instead (check the"
            " shortcut against the release and widen its CHECKED_WITH, or install a checked"
            " release)",
            name,
            "; ".join(found),
        )
    return False


# The shortcuts that said they turned themselves off, so that each says it once.
_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()
_log = logging.getLogger("convoq")


@functools.lru_cache(maxsize=64)
def _outside(package: str, specifier: str) -> str | None:
    """Why ``package`` is not in a release matching ``specifier`` (None if it is)."""
    try:
        installed = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return f"{package} is not installed"
    try:
        inside = installed in SpecifierSet(specifier)
    except InvalidSpecifier:
        return f"{package} bound {specifier!r} is not a version specifier"
    if inside:
        return None
    return f"{package} {installed} is outside the releases it was checked with ({specifier})"


_BOOL = TypeAdapter(bool)


@functools.lru_cache(maxsize=16)
def _fast_paths_from(raw: str | None) -> bool:
    """The switch for one value of the variable, validated as ConvoqSettings validates it
    (and named the same way when it is wrong); the other settings are not read here."""
    if raw is None:
        return defaults.FAST_PATHS
    try:
        return _BOOL.validate_python(raw)
    except ValidationError as exc:
        problems = [f"{FAST_PATHS_VARIABLE}: {problem['msg']}" for problem in exc.errors()]
        raise ConfigurationError(
            "invalid settings: " + "; ".join(problems), problems=problems
        ) from None


def _variable(loc: tuple[int | str, ...]) -> str:
    """``("partitions",)`` -> ``CONVOQ_PARTITIONS`` (the name a user sets)."""
    return "CONVOQ_" + "_".join(str(part) for part in loc).upper()

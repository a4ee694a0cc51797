"""What each caller of the turn protocol uses of it: one narrow role per caller.

:class:`~convoq.redis.protocol.TurnProtocol` holds every verb of the turn protocol; no
caller needs them all. Each caller is typed against its role below, so what it may call
is written down, a reader sees what one side touches without reading its code, and a test
(``tests/redis/test_roles.py``) keeps every role's methods those of the protocol, with the
same signatures. ``TurnProtocol`` satisfies every role (checked by mypy in
:mod:`convoq.redis.protocol`); nothing else implements them today.

| role | caller |
|---|---|
| `EventSink` | `TurnEvents`, a turn's buffered events (`redis/_events.py`) |
| `TurnReader` | webhooks, finished-turn callbacks (`worker/webhooks.py`, `_finished.py`) |
| `SweepStore` | the sweeper (`worker/sweeper.py`) |
| `TimerStore` | the timer poll (`worker/_timers.py`) |
| `ScheduleStore` | whoever schedules a turn: client, worker and Redis memory (`ctx.schedule`) |
| `LeaseStore` | a running turn's lease and checkpoints (`worker/_lease.py`) |
| `RunnerStore` | the drain loop (`worker/runner.py`) |
| `WorkerStore` | the worker's runtime and its parts (`worker/runtime.py`, `worker/_*.py`) |
| `ClientStore` | the client (`client/*`); the gateway goes through the client |
| `HeldStore` | in-process turns under the lease (`redis/_holding.py`) |
| `MemoryStore` | the Redis memory (`memory/redis.py`, `_redis_holds.py`, `_loop_protocols.py`) |

The worker's parts hand the narrower roles to theirs (the runtime builds the runner, the
sweeper and the webhook delivery over its ``WorkerStore``).

Attributes are read-only properties here: a role reads them, never rebinds them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from convoq import defaults

if TYPE_CHECKING:
    from convoq.errors import ConvoqError
    from convoq.limits import Limits, QueueLimits
    from convoq.messages import Message
    from convoq.redis._approvals import Decided
    from convoq.redis._cluster import AsyncRedis
    from convoq.redis._due import Due
    from convoq.redis._durable import Acks
    from convoq.redis._popping import Keep
    from convoq.redis._raw import StoredJson
    from convoq.redis._records import (
        Handoff,
        ParkedTurn,
        SubmitResult,
        Taking,
        TurnEnding,
        TurnRecord,
    )
    from convoq.redis._refusals import Refusal
    from convoq.redis._retrying import Retried
    from convoq.redis._scheduling import Fired, ScheduledTurn, ScheduleResult
    from convoq.redis._sweeping import Stranded, SweepScan
    from convoq.redis._texting import IfBusy, StopFlags
    from convoq.redis._world import SignalKick, Signalled
    from convoq.redis.keys import KeySchema
    from convoq.redis.scripts import Scripts
    from convoq.turn_state import TurnEvent, TurnState
    from convoq.usage import Usage
    from convoq.window import Window

__all__ = [
    "ClientStore",
    "EventSink",
    "HeldStore",
    "LeaseStore",
    "MemoryStore",
    "RunnerStore",
    "ScheduleStore",
    "SweepStore",
    "TimerStore",
    "TurnReader",
    "WorkerStore",
]


class EventSink(Protocol):
    """Where a turn's buffered events go (:class:`~convoq.redis.protocol.TurnEvents`)."""

    def json_arg(self, value: Any, what: str) -> str: ...

    async def emit_many(self, cid: str, turn_id: str, events: Sequence[TurnEvent]) -> bool: ...


class TurnReader(Protocol):
    """Reads a turn's record: webhook delivery and the finished-turn callback."""

    async def get_turn(self, cid: str, turn_id: str) -> TurnRecord: ...


class SweepStore(Protocol):
    """The sweeper: conversations to kick again, and the queued-turn counts to reconcile."""

    async def sweep_candidates(self) -> list[str]: ...

    async def sweep_scan(self) -> SweepScan: ...

    async def mark_swept(self, kicked: Sequence[Stranded], *, interval_ms: int) -> None: ...

    async def reconcile_admitted(self, *, batch: int = 200, grace_ms: int = 60_000) -> int: ...


class TimerStore(Protocol):
    """The timer poll: conversations with due timers, firing them (and the sweep's repair
    of the index)."""

    async def due_conversations(self, limit: int = 200) -> tuple[list[str], int]: ...

    async def fire_due(self, cid: str) -> Fired: ...

    async def repair_timer_index(self) -> dict[str, int]: ...


class ScheduleStore(Protocol):
    """Schedules a turn (a client's submit with a due time, a tool's ``ctx.schedule``)."""

    async def schedule(
        self,
        cid: str,
        turn_id: str,
        *,
        agent: str,
        message: Message,
        options: dict[str, Any],
        due: Due,
        idempotency_key: str | None = None,
        if_busy: Literal["queue", "reject"] = "queue",
    ) -> ScheduleResult: ...


class LeaseStore(EventSink, Protocol):
    """A running turn: its lease renewed, its steps checkpointed, cancels noticed."""

    async def renew(
        self, cid: str, *, fence: int, lease_ms: int, turn_id: str | None = None
    ) -> bool: ...

    async def checkpoint(
        self,
        cid: str,
        turn_id: str,
        *,
        fence: int,
        state: TurnState,
        events: Sequence[TurnEvent] = (),
    ) -> bool: ...

    async def is_cancel_requested(self, cid: str, turn_id: str) -> bool: ...

    async def stop_flags(self, cid: str, turn_id: str) -> StopFlags: ...


class RunnerStore(LeaseStore, TurnReader, ScheduleStore, Protocol):
    """The drain loop: take a conversation's turns, end each, hand off the next."""

    async def take(self, cid: str, taking: Taking, *, head: str | None = None) -> Handoff: ...

    async def release(self, cid: str, turn_id: str, *, fence: int) -> bool: ...

    async def report_cut_off(self, cid: str, turn_id: str, *, fence: int) -> bool: ...

    async def discard(self, cid: str, turn_id: str, *, reason: str = "discarded") -> bool: ...

    async def window(self, cid: str, window: Window) -> list[Message]: ...

    async def park(
        self,
        cid: str,
        turn_id: str,
        *,
        fence: int,
        state: TurnState,
        approval_ttl_ms: int,
        events: Sequence[TurnEvent] = (),
        children: Sequence[str] = (),
    ) -> Literal["parked", "resume"]: ...

    async def commit_and_hand_off(
        self,
        cid: str,
        turn_id: str,
        messages: list[Message],
        ending: TurnEnding,
        *,
        stop_if_cancelled: bool = False,
        output: Any = None,
        expired: bool = False,
        children: Sequence[Mapping[str, Any]] = (),
        interrupted: bool = False,
    ) -> Handoff: ...

    async def fail_and_hand_off(
        self, cid: str, turn_id: str, error: dict[str, Any], ending: TurnEnding
    ) -> Handoff: ...

    async def touch(self, cid: str, *, also: Sequence[str] = ()) -> None: ...

    async def transfer(
        self,
        cid: str,
        turn_id: str,
        *,
        fence: int,
        state: TurnState,
        agent: str,
        release: bool,
        events: Sequence[TurnEvent] = (),
    ) -> None: ...

    async def head_agent(self, cid: str) -> str | None: ...


class WorkerStore(RunnerStore, SweepStore, TimerStore, ScheduleStore, Protocol):
    """A worker process: the runner's and the sweeper's roles, and what the runtime itself
    does (the dataset's epoch, the retention it publishes, uncounting a dropped turn)."""

    @property
    def redis(self) -> AsyncRedis: ...

    @property
    def queue_limits(self) -> QueueLimits: ...

    async def check_epoch(self, expected: str | None) -> str: ...

    async def publish_retention(self) -> None: ...

    async def unadmit_quietly(self, cid: str, turn_id: str) -> None: ...

    async def close(self) -> None: ...


class KeyedStore(Protocol):
    """Its Redis connection and the key names: for reads a role does not name."""

    @property
    def redis(self) -> AsyncRedis: ...

    @property
    def keys(self) -> KeySchema: ...


class TurnControl(TurnReader, KeyedStore, Protocol):
    """Queue a turn, decide its calls, cancel it: what a client does, and what a worker
    does for the child turns of a sub-agent call."""

    async def submit(
        self,
        cid: str,
        turn_id: str,
        *,
        agent: str,
        message: Message,
        options: dict[str, Any],
        idempotency_key: str | None = None,
        if_busy: IfBusy = "queue",
        kick: tuple[str, str] | None = None,
        merge_key: str | None = None,
    ) -> SubmitResult: ...

    async def record_decision(
        self,
        cid: str,
        turn_id: str,
        *,
        call_id: str,
        approved: bool,
        reason: str | None = None,
        by: str | None = None,
        kind: Literal["person", "child", "result"] = "person",
        result: str | None = None,
        is_error: bool = False,
    ) -> Decided: ...

    async def cancel(
        self, cid: str, turn_id: str
    ) -> Literal["cancelled", "stopping", "finished"]: ...


class ClientStore(TurnControl, ScheduleStore, Protocol):
    """The client: submit and control turns, follow them, read conversations and the
    deployment."""

    async def scheduled_turns(self, cid: str, *, limit: int = 100) -> list[ScheduledTurn]: ...

    @property
    def acks(self) -> Acks: ...

    @property
    def queue_limits(self) -> QueueLimits: ...

    async def follow_retention(self) -> None: ...

    async def unadmit_quietly(self, cid: str, turn_id: str) -> None: ...

    async def discard_turn(
        self, cid: str, turn_id: str, *, reason: str = "discarded"
    ) -> str | None: ...

    async def cancel_turn(
        self, cid: str, turn_id: str
    ) -> tuple[Literal["cancelled", "stopping", "finished"], str | None]: ...

    async def turn_agent(self, cid: str, turn_id: str) -> str | None: ...

    async def retry(self, cid: str, turn_id: str, *, token: str) -> Retried: ...

    async def clear(self, cid: str, *, force: bool = False) -> None: ...

    async def history(self, cid: str, *, last_turns: int | None = None) -> list[Message]: ...

    async def history_json(self, cid: str, *, last_turns: int | None = None) -> StoredJson: ...

    async def usage(self, cid: str) -> Usage: ...

    async def parked_turns(
        self, limit: int = 100, *, offset: int = 0, conversation_prefix: str = ""
    ) -> list[ParkedTurn]: ...

    async def send_signal_routed(
        self,
        cid: str,
        name: str,
        payload: str,
        *,
        signal_id: str | None = None,
        by: str | None = None,
        max_kept: int,
        ttl_ms: int,
    ) -> tuple[Signalled, SignalKick | None]: ...

    async def get_turn_and_last_event(self, cid: str, turn_id: str) -> tuple[TurnRecord, str]: ...

    async def read_events(
        self,
        cid: str,
        turn_id: str,
        *,
        after: str = "0",
        block_ms: int = 0,
        count: int = 100,
        live: bool = False,
    ) -> list[tuple[str, TurnEvent]]: ...

    async def read_events_and_turn(
        self, record: TurnRecord, *, after: str, block_ms: int, count: int = 100
    ) -> tuple[list[tuple[str, TurnEvent]], TurnRecord]: ...

    async def replicated_status(self, cid: str, tid: str) -> str | None: ...

    async def registered_agents(self) -> frozenset[str]: ...

    async def registered_workers(
        self, *, heartbeat_s: float = defaults.SWEEP_INTERVAL_S
    ) -> dict[str, dict[str, Any]]: ...

    async def registered_prefixes(self) -> frozenset[str]: ...

    async def close(self) -> None: ...


class HeldStore(Protocol):
    """In-process turns under the lease (:mod:`convoq.redis._holding`): the scripts, the
    keys and limits they are given, the replicas a commit waits for."""

    @property
    def redis(self) -> AsyncRedis: ...

    @property
    def keys(self) -> KeySchema: ...

    @property
    def scripts(self) -> Scripts: ...

    @property
    def limits(self) -> Limits: ...

    @property
    def acks(self) -> Acks: ...

    def refusal(
        self, refusal: Refusal, cid: str, tid: str | None, fence: int | None = None
    ) -> ConvoqError: ...


class MemoryStore(HeldStore, ScheduleStore, Protocol):
    """The Redis memory: windows, appends (scripts and keys), pops, prunes, clears, and
    its in-process turns (the held role, and the lease they renew)."""

    async def window(self, cid: str, window: Window) -> list[Message]: ...

    async def touch(self, cid: str, *, also: Sequence[str] = ()) -> None: ...

    async def prune(self, cid: str, *, keep_last_turns: int) -> int: ...

    async def pop(
        self, cid: str, *, keep: Keep | None = None, wait_s: float = 0.0
    ) -> Message | None: ...

    async def clear(self, cid: str, *, force: bool = False) -> None: ...

    async def renew(
        self, cid: str, *, fence: int, lease_ms: int, turn_id: str | None = None
    ) -> bool: ...

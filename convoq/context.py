"""What a tool, dynamic instructions and an approval policy see of the turn they serve.

A :class:`TurnScope` holds what every part of one turn shares (its conversation, turn id,
agent, attempt, the submitter's ``metadata`` and the application's ``deps``); each tool
call gets a :class:`RunContext` made from it, with the call's id, its step and the usage
so far. Nothing here is serialised except ``metadata``: ``deps`` are application objects
(a database pool, an HTTP client) that each process provides for itself.

``idempotency_key`` is derived from the conversation, the turn, the step and the call id.
The assistant message that asked for the call is journaled before the call runs, so a
call cut off mid-way (its worker killed) reruns with the same id, the same step and thus
the same key: an API that dedupes on a key (payments, e-mail) performs the effect once.

``ctx.schedule`` schedules a follow-up turn through the :class:`Scheduler` of the run
(:func:`use_scheduler`: a worker's store, or a Redis memory's); its idempotency key is the
call's key and the schedule's index in the call, so a rerun of the call schedules nothing
twice.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import copy
import hashlib
import inspect
import json
import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Generic, TypeVar

from convoq._sync import call_maybe_async
from convoq.errors import ConvoqError
from convoq.messages import Message
from convoq.usage import Usage

DepsT = TypeVar("DepsT")

MAX_METADATA_BYTES = 16 * 1024
"""The largest ``metadata`` object accepted (its compact JSON, in bytes)."""


@dataclass(frozen=True)
class ScheduleRequest:
    """A follow-up turn a tool asks for (``ctx.schedule``)."""

    conversation_id: str
    message: str | Message
    agent: str
    delay_s: float | None
    idempotency_key: str
    metadata: dict[str, Any] | None = None
    not_before: datetime | None = None


Scheduler = Callable[[ScheduleRequest], Awaitable[str]]
"""Stores a scheduled turn and returns its id (a resend with the same key: the first's)."""

_scheduler: contextvars.ContextVar[Scheduler | None] = contextvars.ContextVar(
    "convoq_scheduler", default=None
)


@contextlib.contextmanager
def use_scheduler(scheduler: Scheduler | None) -> Iterator[None]:
    """Contexts made inside this block schedule through ``scheduler`` (None: they cannot)."""
    token = _scheduler.set(scheduler)
    try:
        yield
    finally:
        _scheduler.reset(token)


def _current_scheduler() -> Scheduler | None:
    return _scheduler.get()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # made outside a loop (a test, a sync caller)
        return None


SCHEDULE_SYNC_TIMEOUT_S = 30.0
"""How long :meth:`RunContext.schedule_sync` waits for the turn's loop to store a
schedule (a store write, retried while Redis is briefly away)."""


@dataclass(frozen=True)
class RunContext(Generic[DepsT]):
    """The turn a tool call (or a dynamic instruction) runs in.

    Attributes:
        conversation_id: the conversation (None for a call without one).
        turn_id: the turn's id (a worker's turn id; in process, the turn's token, kept
            across an approval's resume).
        agent: the agent profile's name (None when the Agent has none).
        deps: what the Agent or worker profile provides (``deps=`` or ``deps_factory=``).
        metadata: the JSON object given when the turn was submitted (``{}`` if none).
        attempt: which run of the turn this is (1 for the first; a rerun after a worker
            died counts up).
        step: the model calls the turn made so far; for a tool call, the one that asked
            for it.
        usage: tokens the turn's model calls reported so far.
        tool_call_id: the call's id (None outside a tool call).
        tool_name: the called tool's name (None outside a tool call).
        scheduler: what :meth:`schedule` stores follow-up turns with (a worker's store
            or a Redis memory's, set where the turn runs; None where there are no
            durable timers).
    """

    conversation_id: str | None
    turn_id: str
    agent: str | None
    deps: DepsT
    metadata: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1
    step: int = 0
    usage: Usage = field(default_factory=Usage)
    tool_call_id: str | None = None
    tool_name: str | None = None
    scheduler: Scheduler | None = field(
        default_factory=_current_scheduler, repr=False, compare=False
    )
    _schedules: list[str] = field(default_factory=list, repr=False, compare=False)
    # The loop the turn runs on: a sync tool (on a thread of its own) schedules through it.
    _loop: asyncio.AbstractEventLoop | None = field(
        default_factory=_running_loop, repr=False, compare=False
    )

    async def schedule(
        self,
        message: str | Message,
        *,
        delay_s: float | None = None,
        not_before: datetime | None = None,
        agent: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> str:
        """Schedule a follow-up turn of this conversation, ``delay_s`` seconds from now or
        not before ``not_before`` (a timezone-aware datetime; both given, the later), run
        by ``agent`` (default: this turn's); returns its turn id. A rerun of this tool
        call (its worker killed) schedules nothing twice: each schedule is keyed by the
        call's :attr:`idempotency_key` and its index among the call's schedules.

        Raises:
            ConvoqError: outside a tool call, or where no durable timers exist (an Agent
                on in-memory or file memory): it names ``ctx.schedule``.
            InvalidScheduleError: neither time given, ``delay_s`` out of range or a naive
                ``not_before`` (nothing scheduled).
        """
        if self.scheduler is None or self.conversation_id is None:
            raise ConvoqError(
                "ctx.schedule needs durable timers: it works on a worker and for an Agent"
                " on RedisConversationMemory with a conversation_id, not on in-memory or"
                " file memory",
                option="ctx.schedule",
            )
        agent = agent or self.agent
        if agent is None:
            raise ConvoqError("ctx.schedule needs agent= (this agent has no name)", option="agent")
        key = f"{self.idempotency_key}:schedule:{len(self._schedules)}"
        request = ScheduleRequest(
            self.conversation_id, message, agent, delay_s, key, metadata, not_before
        )
        turn_id = await self.scheduler(request)
        self._schedules.append(turn_id)
        return turn_id

    def schedule_sync(
        self,
        message: str | Message,
        *,
        delay_s: float | None = None,
        not_before: datetime | None = None,
        agent: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> str:
        """:meth:`schedule` for a sync tool (which runs on a thread of its own): the same
        schedule, run on the turn's event loop; this thread waits at most
        :data:`SCHEDULE_SYNC_TIMEOUT_S` for it.

        Raises:
            ConvoqError: called on the event loop itself (an async tool awaits
                :meth:`schedule`), or with no loop to run on; the errors of
                :meth:`schedule`; a wait past the timeout (a rerun of the call finds a
                schedule that landed meanwhile by its key).
        """
        loop = self._loop
        if loop is None or loop.is_closed():
            raise ConvoqError(
                "ctx.schedule_sync runs on the turn's event loop, and this context has"
                " none: call it from a tool the turn runs",
                option="ctx.schedule_sync",
            )
        if _running_loop() is loop:
            raise ConvoqError(
                "ctx.schedule_sync would wait on the event loop it needs: in an async"
                " tool, await ctx.schedule(...) instead",
                option="ctx.schedule_sync",
            )
        pending = asyncio.run_coroutine_threadsafe(
            self.schedule(
                message, delay_s=delay_s, not_before=not_before, agent=agent, metadata=metadata
            ),
            loop,
        )
        try:
            return pending.result(timeout=SCHEDULE_SYNC_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            pending.cancel()
            raise ConvoqError(
                f"ctx.schedule_sync got no answer in {SCHEDULE_SYNC_TIMEOUT_S:g} s (is the"
                " store reachable?); a rerun of this call finds a schedule that landed",
                option="ctx.schedule_sync",
            ) from None

    @property
    def idempotency_key(self) -> str:
        """The same string on every run of this tool call; pass it to APIs that dedupe.

        Raises:
            ConvoqError: outside a tool call (instructions have no key).
        """
        if self.tool_call_id is None:
            raise ConvoqError(
                "idempotency_key belongs to a tool call; instructions and other"
                " contexts without a tool_call_id have none"
            )
        return idempotency_key(self.conversation_id, self.turn_id, self.step, self.tool_call_id)


def idempotency_key(conversation_id: str | None, turn_id: str, step: int, call_id: str) -> str:
    """``convoq-`` plus a SHA-256 of the call's coordinates (fits every API's key limit)."""
    parts = json.dumps([conversation_id, turn_id, step, call_id])
    return "convoq-" + hashlib.sha256(parts.encode()).hexdigest()


@dataclass(frozen=True)
class TurnScope:
    """What every context of one turn shares; the engine adds the step and the call."""

    conversation_id: str | None
    turn_id: str
    agent: str | None = None
    deps: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1

    def context(self, step: int, usage: Usage) -> RunContext[Any]:
        """The context at ``step``, outside any tool call (for instructions). Each gets its
        own copy of the metadata: what one tool changes there, the next does not see (as
        after a resume, where it comes from the turn record)."""
        return RunContext(
            conversation_id=self.conversation_id,
            turn_id=self.turn_id,
            agent=self.agent,
            deps=self.deps,
            metadata=copy.deepcopy(self.metadata),
            attempt=self.attempt,
            step=step,
            usage=usage,
        )

    def for_call(self, step: int, usage: Usage, call_id: str, name: str) -> RunContext[Any]:
        """The context of one tool call asked for by model call ``step``."""
        return replace(self.context(step, usage), tool_call_id=call_id, tool_name=name)


Instructions = str | Callable[[RunContext[Any]], str | Awaitable[str]]
"""A system prompt, or a function (sync or async) of the context that returns one."""


def check_metadata(metadata: object) -> dict[str, Any]:
    """A JSON object (str keys) of at most MAX_METADATA_BYTES as compact JSON.

    Raises:
        ConvoqError: not a dict, keys not str, values not JSON, or too big.
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise ConvoqError(
            f"metadata must be a JSON object (a dict), not {type(metadata).__name__}",
            field="metadata",
        )
    if not all(isinstance(k, str) for k in metadata):
        raise ConvoqError("metadata keys must be strings (it travels as JSON)", field="metadata")
    try:
        raw = json.dumps(metadata, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConvoqError(
            f"metadata must hold only JSON values (str, numbers, bools, None, lists, dicts): {exc}",
            field="metadata",
        ) from None
    if len(raw.encode()) > MAX_METADATA_BYTES:
        raise ConvoqError(
            f"metadata is {len(raw.encode())} bytes as JSON, over the limit of"
            f" {MAX_METADATA_BYTES}; keep ids in it and look the rest up in the tool",
            field="metadata",
            size=len(raw.encode()),
            limit=MAX_METADATA_BYTES,
        )
    parsed: dict[str, Any] = json.loads(raw)
    return parsed


class DepsHolder:
    """An Agent's ``deps``: given, or made by ``factory`` once per process (a forked
    worker process makes its own: a pool opened in the parent is no use in a child)."""

    def __init__(self, deps: Any, factory: Callable[[], Any] | None) -> None:
        if factory is not None and deps is not None:
            raise ConvoqError("give deps or deps_factory, not both")
        if factory is not None and not callable(factory):
            raise ConvoqError(f"deps_factory must be a function, not {type(factory).__name__}")
        if inspect.iscoroutinefunction(factory):
            raise ConvoqError(
                "deps_factory must be a plain function (it runs once per process, off the"
                " event loop); open async resources lazily inside the deps object"
            )
        self._deps = deps
        self._factory = factory
        self._made: tuple[int, Any] | None = None
        self._lock = threading.Lock()

    async def get(self) -> Any:
        if self._factory is None:
            return self._deps
        made = self._made
        if made is not None and made[0] == os.getpid():
            return made[1]
        return await call_maybe_async(self._make)

    def _make(self) -> Any:
        with self._lock:  # concurrent first turns make them once
            if self._made is None or self._made[0] != os.getpid():
                assert self._factory is not None
                self._made = (os.getpid(), self._factory())
            return self._made[1]

"""Handles on queued turns and their results.

A handle is two ids (conversation, turn); any process that knows them can build one with
``client.handle(cid, turn_id)``. ``wait`` blocks on the turn's event stream (``XREAD
BLOCK``), not by polling, and re-raises a failed turn's error on the caller's side.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from convoq._sync import iterate_sync
from convoq.client._deployment import stall_note
from convoq.client._sync_methods import blocking
from convoq.client._unreachable import mapped, mapped_stream
from convoq.errors import ConvoqError, TurnCancelledError, TurnTimeoutError, error_from_data
from convoq.messages import Decision, Message, ToolCall
from convoq.output import OutputType, output_shape
from convoq.redis._base import approval_expired_error
from convoq.redis._cluster import connection_option
from convoq.redis._durable import until_durable
from convoq.redis._records import DECISION_FIELD, FINAL_STATUSES, TurnRecord, TurnStatus
from convoq.subagents import ChildTurn, ParentCall, children_of_result
from convoq.turn_state import TurnEvent
from convoq.usage import Usage

if TYPE_CHECKING:
    from convoq.client.aclient import AsyncClient
    from convoq.redis.protocol import SubmitResult

# One XREAD BLOCK at most this long, then the record is read again: a stream that expired
# or was trimmed cannot leave a waiter blocked for ever. The connection's socket timeout
# (CONVOQ_REDIS_SOCKET_TIMEOUT_S, or ?socket_timeout= in the URL) caps the block at half
# of it, so a block never looks like a dead connection (which the client would retry).
_BLOCK_MS = 2_000

WaitUntil = Literal["settled", "final"]
"""What a wait waits for: ``"settled"``, final or parked awaiting approval (a parked turn
waits for a person, so a caller should hear of it); ``"final"``, succeeded, failed,
cancelled, expired, blocked, interrupted or merged only. The HTTP gateway's
``?wait=N&until=`` takes the same two values."""


@dataclass(frozen=True)
class TurnResult:
    """Where a turn stands: final (succeeded/failed/cancelled/expired/blocked, or with
    double texting interrupted/merged) or parked for
    approval (a turn ``waiting`` for child turns is no approval: a wait goes on through
    it). ``expired``: its approval ran out; the turn is stored, its tool results saying
    so, and ``error`` says it expired. ``blocked``: a guardrail tripped; nothing is stored,
    and ``error`` is :class:`~convoq.errors.GuardrailTripped` naming it and its reason.

    Attributes:
        text: the final answer ('' unless succeeded).
        turn: the whole stored turn (user message first) when succeeded or expired.
        error: the turn's error rebuilt as a ConvoqError when failed, cancelled, expired
            or blocked.
        pending_approvals: tool calls waiting for approve/deny when parked.
        attempts: runs of the turn that started: 1, plus one for each run a worker lost
            (or handed back on shutdown) and another took over; a resume after approvals
            goes on with the attempt that parked (0 while queued). A retried turn's
            attempts go on counting.
        retries: how often the turn failed and was retried (``client.retry``).
        usage: tokens the turn's model calls reported, summed (when succeeded; when
            parked, those of the calls made so far).
        finish_reason: why the final model call stopped (``"length"``: cut off).
        refusal: the model's refusal text, when it refused instead of answering.
        output: with an output type, the validated answer as JSON (typed when it comes
            from ``wait(output_type=...)``).
        metadata: the JSON object given at submit (``{}`` if none).
        decisions: the approval decisions on the turn's tool calls, by call id: who
            decided, when, why (or that the approval expired).
        children: when succeeded or expired, the child turns of its sub-agent calls
            (call id, agent, child conversation and turn, status, usage); ``usage`` then
            includes theirs.
        parent: a child turn's parent call (conversation, turn, call id, depth), else None.
        agent: the agent profile that ran the turn last: after a handoff, the one it was
            handed to (:mod:`convoq.handoffs`).
        handed_from: the agent it was submitted for, when it was handed to another (by a
            handoff, or because the conversation had been handed off), else None.
        stopped_by: the turn whose submit (``if_busy="interrupt"`` or ``"rollback"``)
            stopped this one, else None; an ``interrupted`` turn is stored with the steps
            it finished, and ``turn`` holds them.
        merged: the turns whose messages joined this one (``if_busy="merge"``).
        merged_into: for a ``merged`` record, the turn that answers it.
    """

    conversation_id: str
    turn_id: str
    status: TurnStatus
    text: str = ""
    turn: list[Message] = field(default_factory=list)
    error: ConvoqError | None = None
    pending_approvals: list[ToolCall] = field(default_factory=list)
    attempts: int = 0
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
    refusal: str | None = None
    output: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    decisions: dict[str, Decision] = field(default_factory=dict)
    retries: int = 0
    children: list[ChildTurn] = field(default_factory=list)
    parent: ParentCall | None = None
    agent: str = ""
    handed_from: str | None = None
    stopped_by: str | None = None
    merged: tuple[str, ...] = ()
    merged_into: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    def raise_for_error(self) -> TurnResult:
        """Raise the turn's error if it failed, was cancelled, expired or was blocked (a
        guardrail: GuardrailTripped); else return self."""
        if self.error is not None:
            raise self.error
        if self.status == "cancelled":
            raise TurnCancelledError(f"turn {self.turn_id} was cancelled", turn_id=self.turn_id)
        return self


def result_from_record(record: TurnRecord) -> TurnResult:
    """A :class:`TurnResult` from a protocol turn record."""
    data: dict[str, Any] = record.result or {}
    error = error_from_data(record.error) if record.error else None
    if error is None and record.status == "cancelled":
        error = TurnCancelledError(f"turn {record.turn_id} was cancelled")
    if error is None and record.status == "expired":
        error = error_from_data(approval_expired_error())
    return TurnResult(
        conversation_id=record.conversation_id,
        turn_id=record.turn_id,
        status=record.status,
        text=str(data.get("text") or ""),
        turn=_whole_turn(record, data),
        error=error,
        pending_approvals=[ToolCall.model_validate(c) for c in data.get("pending_approvals") or []],
        attempts=record.attempts,
        usage=Usage.model_validate(data["usage"]) if data.get("usage") else Usage(),
        finish_reason=data.get("finish_reason"),
        refusal=data.get("refusal"),
        output=data.get("output"),
        metadata=record.metadata,
        decisions=record.decisions,
        retries=record.retries,
        children=children_of_result(data),
        parent=ParentCall.of(record.options),
        agent=record.agent,
        handed_from=record.handed_from,
        stopped_by=record.stopped_by,
        merged=record.merged,
        merged_into=record.merged_into,
    )


def typed_result(result: TurnResult, output_type: OutputType) -> TurnResult:
    """``result`` with its output as ``output_type`` (a turn that had none: its text,
    parsed). Only a succeeded turn has an output; others are returned as they are.

    Raises:
        OutputValidationError: the output does not fit ``output_type``.
    """
    shape = output_shape(output_type)
    if shape is None or not result.ok:
        return result
    text = result.text if result.output is None else json.dumps(result.output)
    return dataclasses.replace(result, output=shape.parse(text).value)


def _whole_turn(record: TurnRecord, data: dict[str, Any]) -> list[Message]:
    # The record keeps what the turn added after its user message; the input is separate.
    if record.status not in ("succeeded", "expired", "interrupted"):
        return []
    return [record.input, *(Message.model_validate(m) for m in data.get("messages") or [])]


# Events of double texting (docs/double-texting.md): a wait that saw one reads the record
# when the turn is final, for what they changed (stopped_by, merged).
_TEXTING_EVENTS = frozenset({"stop_requested", "merged"})


class AsyncTurnHandle:
    """One queued turn, seen from a client (async)."""

    def __init__(self, client: AsyncClient, conversation_id: str, turn_id: str) -> None:
        self._client = client
        self.conversation_id = conversation_id
        self.turn_id = turn_id
        # The record as submitted and its "queued" event's id: the first wait needs not
        # read them back (set by the client that queued the turn).
        self._start: tuple[TurnRecord, str] | None = None
        # True when the submit that made this handle was answered with an earlier turn
        # (a repeat with the same idempotency key): it queued nothing.
        self.repeated = False
        # With if_busy="merge": the id the submit stored its message under, when that
        # message joined this (queued) turn, which answers it (docs/double-texting.md).
        self.merged_from: str | None = None

    def queued_as(
        self, agent: str, message: Message, options: dict[str, Any], stored: SubmitResult
    ) -> None:
        """Note what this handle's turn was queued with (``stored``: the submit's reply),
        so the first :meth:`wait` blocks on its stream at once."""
        if stored.event_id is None or stored.created_ms is None:
            return
        record = TurnRecord(
            conversation_id=self.conversation_id,
            turn_id=self.turn_id,
            status="queued",
            agent=agent,
            input=message,
            options=options,
            result=None,
            error=None,
            attempts=0,
            created_ms=stored.created_ms,
            started_ms=None,
            finished_ms=None,
        )
        self._start = (record, stored.event_id)

    def __repr__(self) -> str:
        return f"AsyncTurnHandle({self.conversation_id!r}, {self.turn_id!r})"

    @mapped
    async def record(self) -> TurnRecord:
        """The raw turn record (UnknownTurnError if it never existed or expired)."""
        return await self._client.protocol.get_turn(self.conversation_id, self.turn_id)

    async def status(self) -> TurnStatus:
        """queued | running | awaiting_approval | waiting (for its sub-agent calls' child
        turns) | succeeded | failed | cancelled | expired | blocked | interrupted (a newer
        message stopped it; stored as far as it went) | merged (its message joined the
        queued turn ``merged_into``; docs/double-texting.md)."""
        return (await self.record()).status

    async def result(self) -> TurnResult:
        """The turn as it stands now, without waiting."""
        return result_from_record(await self.record())

    @mapped
    async def wait(
        self,
        timeout: float | None = None,
        *,
        raise_on_error: bool = True,
        until: WaitUntil = "settled",
        output_type: OutputType | None = None,
    ) -> TurnResult:
        """Block until the turn settles: it is final, or parked awaiting a person's
        approval (``result.status == "awaiting_approval"``, the calls in
        ``result.pending_approvals``), or scheduled and not yet due (``"scheduled"``, at
        once: it rests until its time); with ``until="final"`` only once it is final. A
        turn whose every pending call is decided is waited for until it ends (or parks
        again): it waits for a worker, not for a person. ``output_type``: the succeeded
        turn's ``output`` comes back as that type (a pydantic model or a dataclass)
        instead of JSON.

        Raises:
            TurnTimeoutError: ``timeout`` seconds passed first (the turn goes on).
            ConvoqError: the turn's own error (rebuilt from its record) if it failed or
                was cancelled and ``raise_on_error`` is true; also when ``until`` is
                neither ``"settled"`` nor ``"final"``.
            OutputValidationError: the output does not fit ``output_type``.
            RedisUnavailableError: Redis cannot be reached or did not answer (named).
        """
        if until not in ("settled", "final"):
            raise ConvoqError(f"until must be 'settled' or 'final', not {until!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        protocol = self._client.protocol
        while True:
            record = await self._settle(deadline, timeout, until)
            if not protocol.acks.enabled or await self._replicated(record):
                break
        result = result_from_record(record)
        if output_type is not None:
            result = typed_result(result, output_type)
        return result.raise_for_error() if raise_on_error else result

    async def _replicated(self, record: TurnRecord) -> bool:
        """Whether replicas have ``record``'s status (min_replicas_acked): False when the
        primary holds another now (a failover lost the write that set it)."""
        protocol = self._client.protocol
        cid, tid = self.conversation_id, self.turn_id
        status = await until_durable(
            lambda: protocol.replicated_status(cid, tid), f"status of {cid}/{tid}"
        )
        return status == record.status

    async def _settle(
        self, deadline: float | None, timeout: float | None, until: WaitUntil
    ) -> TurnRecord:
        """The record once the turn is final (or parked, unless ``until="final"``)."""
        protocol = self._client.protocol
        start, self._start = self._start, None
        if start is not None:
            # Everything after the "queued" event is news: each read brings the record's
            # live fields along (read_events_and_turn).
            record, after = start
        else:
            record, after = await protocol.get_turn_and_last_event(
                self.conversation_id, self.turn_id
            )
        texted = False
        while not await self._settled(record, until):
            block_ms = self._block_for(deadline)
            if block_ms <= 0:
                # A turn nobody took may wait for ever: say why, when the registry knows.
                note = await stall_note(self._client) if record.status == "queued" else ""
                raise TurnTimeoutError(
                    f"turn {self.turn_id} is still {record.status} after {timeout}s;"
                    f" {note or 'wait longer or check it with status()'}",
                    turn_id=self.turn_id,
                    status=record.status,
                )
            # Each wake-up brings the record's status along: the entry that ends a turn
            # carries its live fields (no read once it is final), a start says "running",
            # and another status (or the block running out) has the record read.
            batch, record = await protocol.read_events_and_turn(
                record, after=after, block_ms=block_ms
            )
            if batch:
                after = batch[-1][0]
                texted = texted or any(e.type in _TEXTING_EVENTS for _, e in batch)
        if texted:  # the fields double texting set are no live fields: read them
            record = await protocol.get_turn(self.conversation_id, self.turn_id)
        return record

    async def _settled(self, record: TurnRecord, until: WaitUntil) -> bool:
        if record.status in FINAL_STATUSES:
            return True
        if until == "settled" and record.status == "scheduled":
            return True  # at rest until its time comes: nothing to wait for now
        if until != "settled" or record.status != "awaiting_approval":
            return False
        return not await self._all_decided(record)

    async def _all_decided(self, record: TurnRecord) -> bool:
        """Whether every call the parked turn waits on is decided: then it waits for a
        worker to resume it, not for a person, and a settled wait goes on. (The record
        says awaiting_approval until a worker takes the resumed turn.)"""
        result = record.result or {}
        world = result.get("waits") or {}  # calls a result or a signal decides, no person
        calls = [c for c in result.get("pending_approvals") or [] if c["id"] not in world]
        if not calls:
            return False
        protocol = self._client.protocol
        key = protocol.keys.turn(self.conversation_id, self.turn_id)
        decided = await protocol.redis.hmget(key, [DECISION_FIELD + c["id"] for c in calls])
        return all(value is not None for value in decided)

    async def events(
        self, *, after: str = "0", timeout: float | None = None
    ) -> AsyncIterator[TurnEvent]:
        """The turn's events from the start (or after stream id ``after``) until ``done``:
        ``status``, ``resumed`` (a run goes on with the turn an earlier one started, and
        why: see :class:`~convoq.turn_state.TurnEvent`), ``text_delta``, ``assistant``,
        ``tool_call``, ``tool_result``, ``approval_required``, ``decision``, ``deferred``,
        ``result_supplied``, ``signal_delivered``, ``done``. A failed turn that was
        retried goes on past its first ``done``: ``retried``, then the events of its runs
        after the retry, to their ``done``.

        Raises:
            TurnTimeoutError: ``timeout`` seconds passed without reaching ``done``.
        """
        async for _, event in self.events_with_ids(after=after, timeout=timeout):
            yield event

    @mapped_stream
    async def events_with_ids(
        self, *, after: str = "0", timeout: float | None = None
    ) -> AsyncIterator[tuple[str, TurnEvent]]:
        """:meth:`events` with each event's stream id: pass the last one as ``after`` to
        go on where a dropped reader stopped.

        Raises:
            TurnTimeoutError: ``timeout`` seconds passed without reaching ``done``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        protocol = self._client.protocol
        while True:
            block_ms = self._block_for(deadline)
            if block_ms <= 0:
                raise TurnTimeoutError(
                    f"no 'done' event for turn {self.turn_id} in {timeout}s"
                    + await self._stall_note()
                )
            batch = await protocol.read_events(
                self.conversation_id, self.turn_id, after=after, block_ms=block_ms, live=True
            )
            for event_id, event in batch:
                after = event_id
                yield event_id, event
                if event.type == "done" and not await self._retried_after(event, event_id):
                    return
            if not batch and (await self.record()).status in FINAL_STATUSES:
                return  # final but its stream is gone (expired): nothing more will come

    async def _retried_after(self, done: TurnEvent, event_id: str) -> bool:
        """Whether the turn goes on after this ``done``: it failed, and was retried since
        (a ``retried`` event follows). One read, and only after a failed turn's ``done``."""
        if done.data.get("status") != "failed":
            return False
        protocol = self._client.protocol
        cid, tid = self.conversation_id, self.turn_id
        return bool(await protocol.read_events(cid, tid, after=event_id, count=1))

    async def _stall_note(self) -> str:
        """For a timeout's message: why the turn may wait for ever, if it is still
        queued and the registry knows ("" otherwise)."""
        try:
            queued = (await self.record()).status == "queued"
        except ConvoqError:
            return ""  # gone, or Redis is: the timeout says enough
        note = await stall_note(self._client) if queued else ""
        return f"; {note}" if note else ""

    def _block_for(self, deadline: float | None) -> int:
        """How long the next XREAD may block (ms; <= 0: the deadline passed)."""
        socket_timeout = connection_option(self._client.protocol.redis, "socket_timeout")
        longest = _BLOCK_MS if not socket_timeout else max(1, int(socket_timeout * 500))
        if deadline is None:
            return min(longest, _BLOCK_MS)
        return min(longest, _BLOCK_MS, int((deadline - time.monotonic()) * 1000))

    async def approve(
        self, call_id: str, *, by: str | None = None, reason: str | None = None
    ) -> None:
        await self._client.approve(self, call_id, by=by, reason=reason)

    async def deny(self, call_id: str, reason: str | None = None, *, by: str | None = None) -> None:
        await self._client.deny(self, call_id, reason=reason, by=by)

    async def cancel(self) -> str:
        return await self._client.cancel(self)

    async def retry(self, *, idempotency_key: str | None = None) -> None:
        """Run this failed turn again as the same turn (see ``AsyncClient.retry``)."""
        await self._client.retry(self, idempotency_key=idempotency_key)

    async def discard(self) -> None:
        await self._client.discard(self)


class TurnHandle:
    """One queued turn, seen from a sync client: the methods of :class:`AsyncTurnHandle`,
    blocking."""

    def __init__(self, inner: AsyncTurnHandle) -> None:
        self._async = inner
        self.conversation_id = inner.conversation_id
        self.turn_id = inner.turn_id

    def __repr__(self) -> str:
        return f"TurnHandle({self.conversation_id!r}, {self.turn_id!r})"

    @property
    def async_handle(self) -> AsyncTurnHandle:
        return self._async

    @property
    def merged_from(self) -> str | None:
        """With ``if_busy="merge"``: the id of the submitted message's own record when it
        joined this turn (which answers it), else None."""
        return self._async.merged_from

    @property
    def repeated(self) -> bool:
        """True when the call that made this handle was a repeat of an earlier one (same
        idempotency key) and changed nothing."""
        return self._async.repeated

    record = blocking(AsyncTurnHandle.record)
    status = blocking(AsyncTurnHandle.status)
    result = blocking(AsyncTurnHandle.result)
    wait = blocking(AsyncTurnHandle.wait)
    approve = blocking(AsyncTurnHandle.approve)
    deny = blocking(AsyncTurnHandle.deny)
    cancel = blocking(AsyncTurnHandle.cancel)
    retry = blocking(AsyncTurnHandle.retry)
    discard = blocking(AsyncTurnHandle.discard)

    def events(self, *, after: str = "0", timeout: float | None = None) -> Iterator[TurnEvent]:
        """See :meth:`AsyncTurnHandle.events`."""
        return iterate_sync(self._async.events(after=after, timeout=timeout))

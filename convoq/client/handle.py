"""Handles on queued turns and their results.

A handle is two ids (conversation, turn); any process that knows them can build one with
``client.handle(cid, turn_id)``. ``wait`` blocks on the turn's event stream (``XREAD
BLOCK``), not by polling, and re-raises a failed turn's error on the caller's side.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from convoq._sync import iterate_sync
from convoq.client._blocking import blocking
from convoq.errors import ConvoqError, TurnCancelledError, TurnTimeoutError, error_from_data
from convoq.messages import Message, ToolCall
from convoq.redis._cluster import connection_option
from convoq.redis._durable import until_durable
from convoq.redis._records import FINAL_STATUSES, TurnRecord, TurnStatus
from convoq.turn_state import TurnEvent
from convoq.usage import Usage

if TYPE_CHECKING:
    from convoq.client.aclient import AsyncClient
    from convoq.redis.protocol import SubmitResult

# One XREAD BLOCK at most this long, then the record is read again: a stream that expired
# or was trimmed cannot leave a waiter blocked for ever. convoq.redis.connect sets no
# socket timeout; one given in the URL (?socket_timeout=) caps the block at half of it,
# so a block never looks like a dead connection (which the client would retry, blocked).
_BLOCK_MS = 2_000


@dataclass(frozen=True)
class TurnResult:
    """Where a turn stands: final (succeeded/failed/cancelled) or parked for approval.

    Attributes:
        text: the final answer ('' unless succeeded).
        turn: the whole stored turn (user message first) when succeeded.
        error: the turn's error rebuilt as a ConvoqError when failed or cancelled.
        pending_approvals: tool calls waiting for approve/deny when parked.
        usage: tokens the turn's model calls reported, summed (when succeeded).
        finish_reason: why the final model call stopped (``"length"``: cut off).
        refusal: the model's refusal text, when it refused instead of answering.
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

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    def raise_for_error(self) -> TurnResult:
        """Raise the turn's error if it failed or was cancelled; else return self."""
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
    )


def _whole_turn(record: TurnRecord, data: dict[str, Any]) -> list[Message]:
    # The record keeps what the turn added after its user message; the input is separate.
    if record.status != "succeeded":
        return []
    return [record.input, *(Message.model_validate(m) for m in data.get("messages") or [])]


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

    async def record(self) -> TurnRecord:
        """The raw turn record (UnknownTurnError if it never existed or expired)."""
        return await self._client.protocol.get_turn(self.conversation_id, self.turn_id)

    async def status(self) -> TurnStatus:
        """queued | running | awaiting_approval | succeeded | failed | cancelled."""
        return (await self.record()).status

    async def result(self) -> TurnResult:
        """The turn as it stands now, without waiting."""
        return result_from_record(await self.record())

    async def wait(
        self,
        timeout: float | None = None,
        *,
        raise_on_error: bool = True,
        return_on_approval: bool = False,
    ) -> TurnResult:
        """Block until the turn is final (or parked, with ``return_on_approval``).

        Raises:
            TurnTimeoutError: ``timeout`` seconds passed first (the turn goes on).
            the turn's error (rebuilt from its record) if it failed or was cancelled and
            ``raise_on_error`` is true.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        protocol = self._client.protocol
        while True:
            record = await self._settle(deadline, timeout, return_on_approval)
            if not protocol.acks.enabled or await self._replicated(record):
                break
        result = result_from_record(record)
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
        self, deadline: float | None, timeout: float | None, return_on_approval: bool
    ) -> TurnRecord:
        """The record once the turn is final (or parked, with ``return_on_approval``)."""
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
        while not _settled(record, return_on_approval):
            block_ms = self._block_for(deadline)
            if block_ms <= 0:
                raise TurnTimeoutError(
                    f"turn {self.turn_id} is still {record.status} after {timeout}s;"
                    " wait longer or check it with status()",
                    turn_id=self.turn_id,
                    status=record.status,
                )
            # Each wake-up (an event, or the block running out) brings the record's status
            # along: no extra read once the turn is final.
            batch, record = await protocol.read_events_and_turn(
                record, after=after, block_ms=block_ms
            )
            if batch:
                after = batch[-1][0]
        return record

    async def events(
        self, *, after: str = "0", timeout: float | None = None
    ) -> AsyncIterator[TurnEvent]:
        """The turn's events from the start (or after stream id ``after``) until ``done``.

        Raises:
            TurnTimeoutError: ``timeout`` seconds passed without reaching ``done``.
        """
        async for _, event in self.events_with_ids(after=after, timeout=timeout):
            yield event

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
                raise TurnTimeoutError(f"no 'done' event for turn {self.turn_id} in {timeout}s")
            batch = await protocol.read_events(
                self.conversation_id, self.turn_id, after=after, block_ms=block_ms, live=True
            )
            for event_id, event in batch:
                after = event_id
                yield event_id, event
                if event.type == "done":
                    return
            if not batch and (await self.record()).status in FINAL_STATUSES:
                return  # final but its stream is gone (expired): nothing more will come

    def _block_for(self, deadline: float | None) -> int:
        """How long the next XREAD may block (ms; <= 0: the deadline passed)."""
        socket_timeout = connection_option(self._client.protocol.redis, "socket_timeout")
        longest = _BLOCK_MS if not socket_timeout else max(1, int(socket_timeout * 500))
        if deadline is None:
            return min(longest, _BLOCK_MS)
        return min(longest, _BLOCK_MS, int((deadline - time.monotonic()) * 1000))

    async def approve(self, call_id: str) -> None:
        await self._client.approve(self, call_id)

    async def deny(self, call_id: str, reason: str | None = None) -> None:
        await self._client.deny(self, call_id, reason=reason)

    async def cancel(self) -> str:
        return await self._client.cancel(self)

    async def discard(self) -> None:
        await self._client.discard(self)


def _settled(record: TurnRecord, return_on_approval: bool) -> bool:
    if record.status in FINAL_STATUSES:
        return True
    return return_on_approval and record.status == "awaiting_approval"


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

    record = blocking(AsyncTurnHandle.record)
    status = blocking(AsyncTurnHandle.status)
    result = blocking(AsyncTurnHandle.result)
    wait = blocking(AsyncTurnHandle.wait)
    approve = blocking(AsyncTurnHandle.approve)
    deny = blocking(AsyncTurnHandle.deny)
    cancel = blocking(AsyncTurnHandle.cancel)
    discard = blocking(AsyncTurnHandle.discard)

    def events(self, *, after: str = "0", timeout: float | None = None) -> Iterator[TurnEvent]:
        """See :meth:`AsyncTurnHandle.events`."""
        return iterate_sync(self._async.events(after=after, timeout=timeout))

"""The records the turn protocol hands out, and how they are read from script replies."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast, get_args

from pydantic import ValidationError

from convoq import defaults
from convoq.errors import CorruptDataError
from convoq.messages import Message
from convoq.redis._codec import text
from convoq.turn_state import Decision, TurnEvent, TurnState
from convoq.window import AgentWindows

TurnStatus = Literal[
    "scheduled",
    "queued",
    "running",
    "awaiting_approval",
    "succeeded",
    "failed",
    "cancelled",
    "expired",
    "blocked",
    "waiting",
    "interrupted",
    "merged",
]
_STATUSES: tuple[str, ...] = get_args(TurnStatus)
# expired: the approval ran out; the turn is stored, its tool results saying so. blocked: a
# guardrail tripped; nothing is stored, the error (GuardrailTripped) says which and why.
# waiting (not final): parked until its child turns (sub-agent calls) end. interrupted: a
# newer message stopped it at a step boundary; its finished steps are stored. merged: a
# message that joined a queued turn, which answers it (``merged_into``). scheduled (not
# final): waiting for its due time, in no inbox yet (fire.lua queues it).
FINAL_STATUSES: frozenset[str] = frozenset(
    {"succeeded", "failed", "cancelled", "expired", "blocked", "interrupted", "merged"}
)
DECISION_FIELD = "decision:"


@dataclass(frozen=True)
class TurnRecord:
    """A queued turn as stored: what was asked, where it stands, how it ended."""

    conversation_id: str
    turn_id: str
    status: TurnStatus
    agent: str
    input: Message
    options: dict[str, Any]
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    attempts: int
    created_ms: int
    started_ms: int | None
    finished_ms: int | None
    decisions: dict[str, Decision] = field(default_factory=dict)
    # When a worker took the turn after its approval expired (its undecided calls are then
    # decided as expired and it ends as "expired").
    expired_ms: int | None = None
    # How often the turn failed and was queued again (retry).
    retries: int = 0
    # The agent the turn was queued for, when it was handed to another (``agent``):
    # :mod:`convoq.handoffs`.
    handed_from: str | None = None
    # Double texting (docs/double-texting.md): the turn whose submit stopped this one, and
    # how ("interrupt" or "rollback"); the turn that answers this merged one; the turns
    # merged into this one (their messages follow its own in ``input``).
    stopped_by: str | None = None
    stop: str | None = None
    merged_into: str | None = None
    merged: tuple[str, ...] = ()
    # A scheduled turn: when it is due, and when its timer fired (Redis time, ms).
    due_ms: int | None = None
    fired_ms: int | None = None

    @property
    def metadata(self) -> dict[str, Any]:
        """The JSON object given at submit (``{}`` if none): every tool's ``ctx.metadata``."""
        value = self.options.get("metadata")
        return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Acquired:
    """The lease on a conversation plus the turn to run and its history window.

    ``next_turn_id`` is the turn queued right behind this one when it was handed out (None:
    none yet). Passed back to commit or fail, it lets them hand out that turn in the same
    round trip. ``summarised``: the conversation has a stored summary, which ``history``
    (a plain window) does not apply.
    """

    conversation_id: str
    fence: int
    turn: TurnRecord
    history: list[Message]
    state: TurnState | None
    next_turn_id: str | None = None
    summarised: bool = False


@dataclass(frozen=True)
class Handoff:
    """What a call that hands out turns (acquire, commit, fail) came back with.

    Attributes:
        turn: the turn now held under the lease (None: none to run here).
        failed: turns failed on the way to it (over max attempts): finished turns whose
            callbacks are owed.
        requeued: with :attr:`TurnEnding.requeue`, the turn whose lease was kept (same
            fence) instead of taking it: the caller sends the conversation back in line.
    """

    turn: Acquired | None = None
    failed: tuple[str, ...] = ()
    requeued: str | None = None

    def after(self, failed: str | None) -> Handoff:
        """This hand-off, with ``failed`` (a turn failed before it) reported first."""
        return self if failed is None else replace(self, failed=(failed, *self.failed))


@dataclass(frozen=True)
class Taking:
    """How ``acquire`` runs, for a fresh lease or a hand-off (``worker_id`` '' and the
    caller's ``fence``)."""

    worker_id: str
    lease_ms: int
    windows: AgentWindows
    max_attempts: int
    fence: int
    max_cut_offs: int = defaults.MAX_CUT_OFFS


@dataclass(frozen=True)
class TurnEnding:
    """How the run of a head turn ends under its lease, and how the turn behind it is taken
    in the same round trip: the one request :meth:`~convoq.redis.TurnProtocol.commit` and
    :meth:`~convoq.redis.TurnProtocol.fail` share.

    Attributes:
        fence: the lease's fence token (the write is refused if it moved on).
        lease_ms: the lease TTL the next turn is taken with.
        window: turns of history handed out with the next turn (0: all), the same for
            every agent or by agent (:class:`~convoq.window.AgentWindows`).
        max_attempts: runs of the next turn whose worker died before it fails instead.
        max_cut_offs: runs of the next turn cut off from Redis before it fails instead.
        next_turn_id: the turn expected next (:attr:`Acquired.next_turn_id`).
        events: buffered events to append before the turn's own ("done" comes last).
        requeue: the next turn is not taken: the lease is kept (same fence) for it and
            its id comes back as :attr:`Handoff.requeued`, for the caller to send the
            conversation back in line with the fence as proof (a drain then takes it
            with ``acquire(fence=...)``). If that kick is lost, the lease expires and
            the sweeper kicks the conversation.
    """

    fence: int
    lease_ms: int = defaults.LEASE_MS
    window: int | AgentWindows = 0
    max_attempts: int = defaults.MAX_ATTEMPTS
    max_cut_offs: int = defaults.MAX_CUT_OFFS
    next_turn_id: str | None = None
    events: Sequence[TurnEvent] = ()
    requeue: bool = False

    @property
    def expected_next(self) -> str | None:
        """The turn the script is asked to hand out itself (none when it is requeued)."""
        return None if self.requeue else self.next_turn_id

    def taking(self) -> Taking:
        """The hand-off of the next turn: same fence, no new holder."""
        windows = AgentWindows.of(self.window)
        return Taking("", self.lease_ms, windows, self.max_attempts, self.fence, self.max_cut_offs)


@dataclass(frozen=True)
class AttachmentNote:
    """An attachment named, not carried: ``kind`` "image" or "file", its MIME type and
    file name (None when it has none)."""

    kind: str
    mime_type: str
    filename: str | None = None


@dataclass(frozen=True)
class RecentMessage:
    """A stored message as a person deciding an approval reads it: role, text (cut
    short), attachments by name and type only, and the names of the tools it called."""

    role: str
    text: str
    attachments: tuple[AttachmentNote, ...] = ()
    tool_calls: tuple[str, ...] = ()


@dataclass(frozen=True)
class ParkedTurn:
    """A turn awaiting approval: its record (``result["pending_approvals"]`` are the calls
    waiting), when it parked and when its approval expires (unix ms), and ``recent``: the
    messages of the conversation's last stored turns before it (bounded, see
    :meth:`~convoq.redis._approvals.ApprovalsMixin.parked_turns`)."""

    record: TurnRecord
    parked_ms: int
    expires_ms: int
    recent: tuple[RecentMessage, ...] = ()

    @property
    def parent(self) -> dict[str, Any] | None:
        """A child turn's parent call, waiting for it (``{"conversation_id", "turn_id",
        "call_id", "depth"}``, as :class:`convoq.subagents.ParentCall` reads it), else
        None."""
        called = self.record.options.get("subagent")
        return dict(called) if isinstance(called, dict) else None


@dataclass(frozen=True)
class SubmitResult:
    """``position`` 0: the conversation was idle and the caller sends a kick, unless the
    script pushed it already (``kicked``). For a duplicate, ``turn_id`` is the first turn
    and ``position`` its place in the inbox (-1 when it is no longer queued). A turn queued
    by this call also says its "queued" event's stream id and its record's ``created_ms``
    (a waiter starts from them without reading them back)."""

    turn_id: str
    position: int
    duplicate: bool
    event_id: str | None = None
    created_ms: int | None = None
    kicked: bool = False
    # Double texting: the queued turn this one joined (``turn_id`` then ended "merged"),
    # and what became of the inbox head (``head``): "stopping" (flagged to interrupt or
    # roll back), "cancelled" (ended here: the caller sends a kick) or None.
    merged_into: str | None = None
    stopped: str | None = None
    head: str | None = None


def _text(fields: dict[str, bytes], name: str) -> str | None:
    value = fields.get(name)
    return None if value is None else text(value)


def _int(fields: dict[str, bytes], name: str) -> int | None:
    value = _text(fields, name)
    return int(value) if value not in (None, "") else None


def _json(fields: dict[str, bytes], name: str) -> Any:
    value = fields.get(name)
    return json.loads(value) if value is not None else None


def decode_record(cid: str, tid: str, fields: dict[str, bytes], key: str) -> TurnRecord:
    """A turn record from its hash fields; CorruptDataError naming ``key`` if it does not parse."""
    try:
        status = _text(fields, "status")
        if status not in _STATUSES:
            raise ValueError(f"unknown status {status!r}")
        return TurnRecord(
            conversation_id=cid,
            turn_id=tid,
            status=cast(TurnStatus, status),
            agent=_text(fields, "agent") or "",
            input=_input(fields),
            options=_json(fields, "options") or {},
            result=_json(fields, "result"),
            error=_json(fields, "error"),
            attempts=_int(fields, "attempts") or 0,
            created_ms=_int(fields, "created_ms") or 0,
            started_ms=_int(fields, "started_ms"),
            finished_ms=_int(fields, "finished_ms"),
            decisions=_decisions(fields),
            expired_ms=_int(fields, "expired_ms"),
            retries=_int(fields, "retries") or 0,
            handed_from=_text(fields, "handed_from"),
            stopped_by=_text(fields, "stopped_by"),
            stop=_text(fields, "stop"),
            merged_into=_text(fields, "merged_into"),
            merged=tuple(item["turn_id"] for item in _json(fields, "merged") or []),
            due_ms=_int(fields, "due_ms"),
            fired_ms=_int(fields, "fired_ms"),
        )
    except (ValueError, KeyError, TypeError, ValidationError) as exc:
        raise CorruptDataError(
            f"the turn record {key} does not parse ({type(exc).__name__}: {exc}"[:300]
            + "); cancel the turn or clear the conversation",
            key=key,
        ) from exc


def _input(fields: dict[str, bytes]) -> Message:
    """The turn's user message: its own, then those of the turns merged into it (``merged``:
    ``[{turn_id, input}]`` in the order they came), their parts in order, as one message."""
    own = Message.model_validate_json(fields["input"])
    merged = _json(fields, "merged")
    if not merged:
        return own
    parts = list(own.content)
    for item in merged:
        parts.extend(Message.model_validate(item["input"]).content)
    return own.model_copy(update={"content": parts})


def _decisions(fields: dict[str, bytes]) -> dict[str, Decision]:
    """The decisions recorded on the turn's pending calls, by call id (its audit trail)."""
    found = {
        name[len(DECISION_FIELD) :]: Decision.model_validate_json(value)
        for name, value in fields.items()
        if name.startswith(DECISION_FIELD)
    }
    return with_stored_decisions(found, _json(fields, "result"))


def with_stored_decisions(
    decisions: dict[str, Decision], result: dict[str, Any] | None
) -> dict[str, Decision]:
    """``decisions`` plus those the stored tool results of the turn's ``result`` carry (a
    finished turn's record read without its decision fields still has them)."""
    merged = dict(decisions)
    for raw in (result or {}).get("messages") or []:
        decision = raw.get("decision") if isinstance(raw, dict) else None
        call_id = raw.get("tool_call_id") if isinstance(raw, dict) else None
        if decision is not None and isinstance(call_id, str):
            merged.setdefault(call_id, Decision.model_validate(decision))
    return merged


def decode_state(
    kind: str | None, raw: bytes | None, fields: dict[str, bytes], key: str
) -> TurnState | None:
    """The state a turn resumes from: its journal, or its continuation plus decisions."""
    if not kind or raw is None:
        return None
    try:
        state = TurnState.model_validate_json(raw)
        if kind == "cont":
            for name, value in fields.items():
                if name.startswith(DECISION_FIELD):
                    call_id = name[len(DECISION_FIELD) :]
                    state.decisions[call_id] = Decision.model_validate_json(value)
    except ValidationError as exc:
        raise CorruptDataError(
            f"the saved state of {key} does not parse; cancel the turn or clear the conversation",
            key=key,
        ) from exc
    return state

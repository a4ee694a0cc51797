"""The response bodies of the gateway (pydantic: they are its OpenAPI schema); what
requests carry is :mod:`.inputs`. Messages go out in their JSON form (attachments as
base64)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Literal

from pydantic import BaseModel, Field

from convoq.messages import Decision, FilePart, ImagePart, Message, ToolCall
from convoq.redis._scheduling import ScheduledTurn
from convoq.redis.protocol import ParkedTurn, TurnRecord
from convoq.subagents import ParentCall, children_of_result
from convoq.usage import Usage


class TurnLinks(BaseModel):
    self: str
    events: str
    cancel: str
    retry: str = Field(description="POST: run the turn again once it failed.")


class TurnAccepted(BaseModel):
    """The answer to a submit: 202, the turn is queued."""

    conversation_id: str
    turn_id: str
    status: str
    links: TurnLinks
    merged_from: str | None = Field(
        default=None,
        description='"if_busy": "merge": the id the message was stored under when it joined'
        " the queued turn turn_id, which answers it (that record ends merged).",
    )


class ChildTurnView(BaseModel):
    """A sub-agent call's child turn, as its finished parent lists it."""

    call_id: str
    agent: str
    conversation_id: str
    turn_id: str
    status: str
    usage: Usage = Field(description="Its usage, its own children's included.")


class ParentCallView(BaseModel):
    """The sub-agent call a child turn answers."""

    conversation_id: str
    turn_id: str
    call_id: str
    depth: int = Field(description="1: the child of a turn nobody called.")


class WaitingCallView(BaseModel):
    """A parked call that waits for the world: ``on`` "result" (``complete_call``) or
    "signal" (the signal ``signal``), with its ``timeout_s`` and ``metadata``."""

    call_id: str
    name: str
    on: Literal["result", "signal"]
    signal: str | None = None
    timeout_s: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


def waiting_for(status: str, data: dict[str, Any]) -> list[WaitingCallView]:
    """The parked record's calls that wait for the world (none once it left the park)."""
    waits = data.get("waits") or {}
    if status not in ("waiting", "awaiting_approval"):
        return []
    return [
        WaitingCallView(
            call_id=c["id"],
            name=c.get("name", ""),
            on=waits[c["id"]]["on"],
            signal=waits[c["id"]].get("name"),
            timeout_s=waits[c["id"]].get("timeout_s"),
            metadata=waits[c["id"]].get("metadata") or {},
        )
        for c in data.get("pending_approvals") or []
        if c.get("id") in waits
    ]


class TurnView(BaseModel):
    """A turn where it stands: final, parked for approval, or still in progress."""

    conversation_id: str
    turn_id: str
    status: str
    agent: str
    text: str = ""
    messages: list[Message] = Field(default_factory=list, description="What the turn added.")
    pending_approvals: list[ToolCall] = Field(default_factory=list)
    error: dict[str, Any] | None = None
    attempts: int = 0
    retries: int = Field(default=0, description="How often it failed and was retried.")
    usage: Usage = Field(
        default_factory=Usage,
        description="Tokens its model calls reported (parked: those made so far).",
    )
    finish_reason: str | None = Field(default=None, description='"length": cut off.')
    refusal: str | None = Field(default=None, description="The model's refusal, if it refused.")
    output: Any = Field(default=None, description="The validated answer (with an output type).")
    created_ms: int
    started_ms: int | None = None
    finished_ms: int | None = None
    due_ms: int | None = Field(default=None, description="A scheduled turn: when it is due.")
    fired_ms: int | None = Field(
        default=None, description="A scheduled turn: when it joined its conversation's line."
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="As submitted.")
    decisions: dict[str, Decision] = Field(
        default_factory=dict, description="Approval decisions by call id: who, when, why."
    )
    children: list[ChildTurnView] = Field(
        default_factory=list,
        description="Finished: the child turns of its sub-agent calls (usage includes theirs).",
    )
    waiting_for: list[WaitingCallView] = Field(
        default_factory=list,
        description="Parked: the calls that wait for a result or a signal, and for what.",
    )
    parent: ParentCallView | None = Field(
        default=None, description="A child turn: the sub-agent call it answers."
    )
    handed_from: str | None = Field(
        default=None,
        description="The agent it was submitted for, when it was handed to another"
        " (``agent``: the one that ran it last).",
    )
    stopped_by: str | None = Field(
        default=None,
        description='The turn whose submit ("if_busy": "interrupt" or "rollback") stopped'
        " this one.",
    )
    merged: list[str] = Field(
        default_factory=list, description='Turns whose messages joined this one ("merge").'
    )
    merged_into: str | None = Field(
        default=None, description="A merged message: the turn that answers it."
    )

    @classmethod
    def of(cls, record: TurnRecord) -> TurnView:
        data: dict[str, Any] = record.result or {}
        done = record.status == "succeeded"
        stored = record.status in ("succeeded", "expired", "interrupted")
        return cls(
            conversation_id=record.conversation_id,
            turn_id=record.turn_id,
            status=record.status,
            agent=record.agent,
            text=str(data.get("text") or "") if done else "",
            messages=[Message.model_validate(m) for m in data.get("messages") or []]
            if stored
            else [],
            pending_approvals=[
                ToolCall.model_validate(c)
                for c in data.get("pending_approvals") or []
                if c.get("id") not in (data.get("waits") or {})  # decided by the world
            ]
            if record.status == "awaiting_approval"
            else [],
            waiting_for=waiting_for(record.status, data),
            error=record.error,
            attempts=record.attempts,
            retries=record.retries,
            # Parked: the usage of the model calls made so far.
            usage=Usage.model_validate(data["usage"])
            if data.get("usage") and (done or record.status == "awaiting_approval")
            else Usage(),
            finish_reason=data.get("finish_reason") if done else None,
            refusal=data.get("refusal") if done else None,
            output=data.get("output") if done else None,
            created_ms=record.created_ms,
            started_ms=record.started_ms,
            finished_ms=record.finished_ms,
            due_ms=record.due_ms,
            fired_ms=record.fired_ms,
            metadata=record.metadata,
            decisions=record.decisions,
            children=[ChildTurnView(**asdict(c)) for c in children_of_result(data)],
            parent=_parent_view(record),
            handed_from=record.handed_from,
            stopped_by=record.stopped_by,
            merged=list(record.merged),
            merged_into=record.merged_into,
        )


def _parent_view(record: TurnRecord) -> ParentCallView | None:
    parent = ParentCall.of(record.options)
    return ParentCallView(**asdict(parent)) if parent is not None else None


class DecisionResult(BaseModel):
    """``resume``: every pending call is decided, the turn goes on on a worker;
    ``pending``: other calls of the turn still wait. ``decision``: as recorded."""

    outcome: Literal["resume", "pending"]
    turn: TurnView
    decision: Decision | None = None


class CancelResult(BaseModel):
    outcome: Literal["cancelled", "stopping", "finished"]


class History(BaseModel):
    """One page of a conversation's stored messages, oldest first."""

    conversation_id: str
    messages: list[Message]
    offset: int
    total: int


class AttachmentNote(BaseModel):
    """An attachment by name and type (its bytes are not sent)."""

    kind: Literal["image", "file"]
    mime_type: str
    filename: str | None = None


class RecentMessage(BaseModel):
    """A message before the parked turn, as a person deciding reads it."""

    role: str
    text: str = Field(description="Its text, cut at 1000 characters.")
    attachments: list[AttachmentNote] = Field(default_factory=list)
    tool_calls: list[str] = Field(default_factory=list, description="Names of tools it called.")

    @classmethod
    def of(cls, recent: Any) -> RecentMessage:
        notes = [AttachmentNote.model_validate(a, from_attributes=True) for a in recent.attachments]
        return cls(role=recent.role, text=recent.text, attachments=notes,
                   tool_calls=list(recent.tool_calls))  # fmt: skip


def _attachment_note(part: ImagePart | FilePart) -> AttachmentNote:
    filename = part.filename if isinstance(part, FilePart) else None
    return AttachmentNote(kind=part.type, mime_type=part.mime_type, filename=filename)


class Approval(BaseModel):
    """A turn waiting for decisions on its tool calls (the approvals inbox), with what a
    person needs to decide: its metadata and the conversation before it."""

    conversation_id: str
    turn_id: str
    agent: str
    input_text: str
    input_attachments: list[AttachmentNote] = Field(
        default_factory=list, description="The turn's attachments, by name and type."
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="As submitted.")
    conversation: list[RecentMessage] = Field(
        default_factory=list,
        description="The messages of the conversation's last few stored turns, oldest first.",
    )
    pending_approvals: list[ToolCall]
    parked_ms: int
    expires_ms: int
    decisions: dict[str, Decision] = Field(
        default_factory=dict, description="Decisions on some of its calls so far."
    )
    parent: ParentCallView | None = Field(
        default=None,
        description="A child turn (a sub-agent call): the call, and the parent waiting for it.",
    )

    @classmethod
    def of(cls, parked: ParkedTurn) -> Approval:
        record = parked.record
        calls = (record.result or {}).get("pending_approvals") or []
        attached = [_attachment_note(p) for p in record.input.attachments]
        return cls(
            conversation_id=record.conversation_id,
            turn_id=record.turn_id,
            agent=record.agent,
            input_text=record.input.text[:2000],
            input_attachments=attached,
            metadata=record.metadata,
            conversation=[RecentMessage.of(m) for m in parked.recent],
            pending_approvals=[ToolCall.model_validate(c) for c in calls],
            parked_ms=parked.parked_ms,
            expires_ms=parked.expires_ms,
            decisions=record.decisions,
            parent=_parent_view(record),
        )


class Approvals(BaseModel):
    now_ms: int = Field(description="The server's clock, to count down to expires_ms.")
    turns: list[Approval]
    next_offset: int | None = Field(
        default=None, description="The offset of the next page; null: this is the last."
    )


class ScheduledView(BaseModel):
    """A scheduled turn still waiting for its time."""

    turn_id: str
    agent: str
    due_ms: int
    created_ms: int
    input_text: str
    metadata: dict[str, Any] = Field(default_factory=dict, description="As submitted.")

    @classmethod
    def of(cls, turn: ScheduledTurn) -> ScheduledView:
        record = turn.record
        return cls(
            turn_id=turn.turn_id,
            agent=record.agent,
            due_ms=turn.due_ms,
            created_ms=record.created_ms,
            input_text=record.input.text,
            metadata=record.metadata,
        )


class Scheduled(BaseModel):
    """A conversation's scheduled turns, earliest first."""

    conversation_id: str
    now_ms: int = Field(description="The server's clock, to count down to due_ms.")
    turns: list[ScheduledView]


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    detail: str = ""

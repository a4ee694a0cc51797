"""The answers of the console's routes (:mod:`.routes_console`): pydantic models, so the
OpenAPI document shows them. Attachments are never carried here: a transcript names each
by its SHA-256, and its bytes come from the attachment route one at a time."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from convoq.gateway.models import ChildTurnView, ParentCallView
from convoq.gateway.timeline import Step
from convoq.messages import Decision, ToolCall
from convoq.observe import tracing
from convoq.pricing import Cost
from convoq.redis._inspect import Lease, TurnBrief
from convoq.redis._records import TurnRecord
from convoq.usage import Usage


class KeyInfo(BaseModel):
    """The calling API key: its name, scopes and the conversation ids it may reach."""

    name: str
    scopes: list[str]
    conversation_prefix: str = Field(description="Only conversation ids starting with it.")
    may_set_by: bool = False


class LeaseView(BaseModel):
    """Who holds a conversation now."""

    state: str = Field(description='"active": a turn runs; "parked": one awaits approval.')
    holder: str | None = Field(default=None, description="The worker id holding it.")
    expires_ms: int | None = None

    @classmethod
    def of(cls, lease: Lease | None) -> LeaseView | None:
        if lease is None:
            return None
        return cls(state=lease.state, holder=lease.holder, expires_ms=lease.expires_ms)


class TurnRow(BaseModel):
    """A turn in brief, as a list shows it."""

    conversation_id: str
    turn_id: str
    status: str
    agent: str
    created_ms: int | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    attempts: int = 0
    retries: int = 0
    error: dict[str, Any] | None = None

    @classmethod
    def of(cls, brief: TurnBrief) -> TurnRow:
        return cls.model_validate(brief, from_attributes=True)


class ConversationRow(BaseModel):
    """A conversation in the list: what it stores, what waits, its latest turn."""

    conversation_id: str
    stored_turns: int
    queued: int = Field(description="Turns waiting in its inbox (not running, not parked).")
    running: bool
    parked: bool = Field(description="A turn awaits approval.")
    latest_turn: TurnRow | None = None
    activity_ms: int | None = Field(
        default=None, description="The latest turn's last change: finished, started or created."
    )


class ConversationList(BaseModel):
    conversations: list[ConversationRow]
    found: int = Field(description="Conversations matching, of which the first are listed.")
    complete: bool = Field(description="False: the scan stopped at its bound (see the docs).")


class SummaryView(BaseModel):
    text: str
    watermark: int | None = Field(default=None, description="Stored turns it covers.")


class ConversationView(BaseModel):
    """A conversation now: stored turns, usage, summary, its inbox and lease."""

    conversation_id: str
    stored_turns: int
    stored_bytes: int
    stored_elements: int = Field(description="Elements in its history list (transcript paging).")
    usage: Usage
    usage_by_model: dict[str, Usage] = Field(
        default_factory=dict, description="The usage of each model that answered."
    )
    cost: Cost | None = Field(
        default=None, description="What that usage cost (CONVOQ_MODEL_PRICES; unset: null)."
    )
    summary: SummaryView | None = None
    inbox: list[TurnRow] = Field(description="Its inbox, head first: the head runs or is parked.")
    inbox_length: int
    lease: LeaseView | None = None


class TurnList(BaseModel):
    """A conversation's turns with a record, newest first."""

    conversation_id: str
    turns: list[TurnRow]
    total: int = Field(description="Turn records found.")
    next_before: str | None = Field(default=None, description="The cursor of the next page.")
    complete: bool


class TextOut(BaseModel):
    type: Literal["text"]
    text: str


class AttachmentOut(BaseModel):
    """An attachment named by its SHA-256 (GET ``.../attachments/{sha256}`` has its bytes)."""

    type: Literal["image", "file"]
    mime_type: str
    filename: str | None = None
    sha256: str | None = None
    size: int | None = None


PartOut = Annotated[TextOut | AttachmentOut, Field(discriminator="type")]


class TranscriptMessage(BaseModel):
    role: str
    content: list[PartOut] = Field(default_factory=list)
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    refusal: str | None = None
    usage: Usage | None = None
    finish_reason: str | None = None
    decision: Decision | None = None


class TranscriptTurn(BaseModel):
    index: int = Field(description="Its first element's place in the history list.")
    messages: list[TranscriptMessage]


class Transcript(BaseModel):
    """Stored turns, newest first; attachments by reference."""

    conversation_id: str
    total: int = Field(description="Elements in the history list.")
    turns: list[TranscriptTurn]
    next_before: int | None = Field(default=None, description="null: this page reached the start.")
    lead: list[TranscriptMessage] = Field(
        default_factory=list, description="Leading system messages, on the last page only."
    )


class AttachmentNote(BaseModel):
    kind: Literal["image", "file"]
    mime_type: str
    filename: str | None = None


class TurnDetail(BaseModel):
    """One turn for the console: its record in brief, its input and its steps."""

    conversation_id: str
    turn_id: str
    status: str
    agent: str
    input_text: str
    input_attachments: list[AttachmentNote] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict, description="As submitted.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="How it was asked to run (model settings, window...)."
    )
    text: str = Field(default="", description="The answer, once it succeeded.")
    usage: Usage = Field(default_factory=Usage)
    cost: Cost | None = Field(
        default=None,
        description="What its model calls cost (CONVOQ_MODEL_PRICES; unset: null).",
    )
    error: dict[str, Any] | None = None
    attempts: int = 0
    retries: int = 0
    created_ms: int
    started_ms: int | None = None
    finished_ms: int | None = None
    pending_approvals: list[ToolCall] = Field(default_factory=list)
    decisions: dict[str, Decision] = Field(default_factory=dict)
    steps: list[Step]
    parent: ParentCallView | None = Field(
        default=None, description="A child turn (a sub-agent call): the call it answers."
    )
    children: list[ChildTurnView] = Field(
        default_factory=list,
        description="Its sub-agent calls' child turns: as its result lists them once it is"
        " final, as they stand while it waits for them.",
    )
    running_on: str | None = Field(default=None, description="The worker running it now.")
    last_event_id: str = Field(default="0", description="Follow its events after this id.")

    @classmethod
    def of(cls, record: TurnRecord, steps: list[Step], last_event_id: str) -> TurnDetail:
        data: dict[str, Any] = record.result or {}
        parked = record.status in ("awaiting_approval", "waiting")
        shown = {k: v for k, v in record.options.items() if k not in _NOT_OPTIONS}
        usage = data.get("usage") if record.status == "succeeded" or parked else None
        return cls(
            conversation_id=record.conversation_id,
            turn_id=record.turn_id,
            status=record.status,
            agent=record.agent,
            input_text=record.input.text,
            input_attachments=[_note(p) for p in record.input.attachments],
            metadata=record.metadata,
            options=shown,
            text=str(data.get("text") or "") if record.status == "succeeded" else "",
            usage=Usage.model_validate(usage) if isinstance(usage, dict) else Usage(),
            error=record.error,
            attempts=record.attempts,
            retries=record.retries,
            created_ms=record.created_ms,
            started_ms=record.started_ms,
            finished_ms=record.finished_ms,
            pending_approvals=[
                ToolCall.model_validate(c)
                for c in data.get("pending_approvals") or []
                if c.get("id") not in (data.get("waits") or {})  # a person decides none of these
            ]
            if parked
            else [],
            decisions=record.decisions,
            steps=steps,
            last_event_id=last_event_id,
        )


# Shown apart (metadata) or of no use to a reader (the submit's trace context).
_NOT_OPTIONS = frozenset({"metadata", tracing.OPTION})


def _note(part: Any) -> AttachmentNote:
    filename = getattr(part, "filename", None)
    return AttachmentNote(kind=part.type, mime_type=part.mime_type, filename=filename)


class MCPServerHealth(BaseModel):
    """An MCP server as one worker sees it (its heartbeat's report)."""

    name: str
    state: str = Field(description="connected, unreachable, or not started (no turn needed it yet)")
    tools: int | None = Field(default=None, description="How many tools it lists.")
    error: str | None = Field(default=None, description="Its last error.")


class WorkerView(BaseModel):
    """A worker as it registered, judged now, with the turns it runs."""

    name: str
    alive: bool
    last_seen: str | None = None
    last_seen_s: float | None = None
    pid: int | None = None
    worker_id: str | None = Field(default=None, description="The id it holds leases as.")
    queues: list[str] = Field(default_factory=list)
    partitions: int | None = None
    agents: list[str] = Field(default_factory=list, description="The profiles it serves.")
    concurrency: int | None = Field(default=None, description="Its slots.")
    running: int = Field(description="Turns it runs now (slots in use).")
    started_ms: int | None = None
    mcp: list[MCPServerHealth] = Field(
        default_factory=list, description="The MCP servers its profiles use, by its heartbeat."
    )


class PartitionBacklog(BaseModel):
    partition: int
    queue: str
    queued: int = Field(description="Turns waiting for a worker.")
    running: int
    parked: int = Field(description="Turns awaiting approval (they hold no slot).")


class WorkersView(BaseModel):
    workers: list[WorkerView]
    partitions: list[PartitionBacklog]
    elsewhere: int = Field(
        description="Turns running under a lease no registered worker holds (in process)."
    )
    complete: bool = Field(description="False: the scan of inboxes stopped at its bound.")

"""The request and response bodies of the gateway (pydantic: they are its OpenAPI schema).

A message is the text alone or a :class:`convoq.messages.Message` in its JSON form: parts
``{"type": "text", "text": ...}``, ``{"type": "image", "data": <base64>, "mime_type":
...}`` and ``{"type": "file", "data": <base64>, "mime_type": ..., "filename": ...}``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from convoq.messages import Decision, Message, ToolCall
from convoq.redis.protocol import ParkedTurn, TurnRecord
from convoq.usage import Usage


class TurnRequest(BaseModel):
    """``POST /v1/conversations/{cid}/turns`` (JSON; multipart takes the same fields)."""

    # "model_settings" is a field, not pydantic API (pydantic < 2.10 would warn).
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    message: str | Message = Field(description="The user's text, or a user message.")
    agent: str = Field(min_length=1, max_length=256, description="The agent profile.")
    keep_last_turns: int | None = Field(
        default=None, ge=0, description="Previous turns sent to the model (0: all)."
    )
    max_history_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Send only the newest whole previous turns that fit this many tokens.",
    )
    if_busy: Literal["queue", "reject"] = Field(
        default="queue", description="reject: 409 while another turn is in progress."
    )
    callback_url: str | None = Field(
        default=None, description="Gets one signed POST when the turn is final."
    )
    model_settings: dict[str, Any] | None = Field(
        default=None,
        description="temperature, max_tokens, top_p, stop, seed, tool_choice,"
        " parallel_tool_calls, extra_body: merged over the profile's (JSON body only).",
    )
    output_schema: dict[str, Any] | None = Field(
        default=None,
        description="The JSON schema of an object the answer must fit; the result's"
        " output holds it validated (JSON body only).",
    )
    metadata: dict[str, Any] | None = Field(
        default=None,
        description="A JSON object stored with the turn; its tools read it as ctx.metadata"
        " (16 KiB at most). In multipart, a field holding the JSON.",
    )


class TurnLinks(BaseModel):
    self: str
    events: str
    cancel: str


class TurnAccepted(BaseModel):
    """The answer to a submit: 202, the turn is queued."""

    conversation_id: str
    turn_id: str
    status: str
    links: TurnLinks


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
    usage: Usage = Field(default_factory=Usage, description="Tokens its model calls reported.")
    finish_reason: str | None = Field(default=None, description='"length": cut off.')
    refusal: str | None = Field(default=None, description="The model's refusal, if it refused.")
    output: Any = Field(default=None, description="The validated answer (with an output type).")
    created_ms: int
    started_ms: int | None = None
    finished_ms: int | None = None
    metadata: dict[str, Any] = Field(default_factory=dict, description="As submitted.")
    decisions: dict[str, Decision] = Field(
        default_factory=dict, description="Approval decisions by call id: who, when, why."
    )

    @classmethod
    def of(cls, record: TurnRecord) -> TurnView:
        data: dict[str, Any] = record.result or {}
        done = record.status == "succeeded"
        stored = record.status in ("succeeded", "expired")
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
                ToolCall.model_validate(c) for c in data.get("pending_approvals") or []
            ]
            if record.status == "awaiting_approval"
            else [],
            error=record.error,
            attempts=record.attempts,
            usage=Usage.model_validate(data["usage"]) if done and data.get("usage") else Usage(),
            finish_reason=data.get("finish_reason") if done else None,
            refusal=data.get("refusal") if done else None,
            output=data.get("output") if done else None,
            created_ms=record.created_ms,
            started_ms=record.started_ms,
            finished_ms=record.finished_ms,
            metadata=record.metadata,
            decisions=record.decisions,
        )


class DecisionRequest(BaseModel):
    """Approve or deny one pending tool call."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "deny"]
    reason: str | None = Field(default=None, max_length=2000, description="Told to the model.")
    by: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Who decided, for keys allowed to say (may_set_by); else the key's name.",
    )


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


class Approval(BaseModel):
    """A turn waiting for decisions on its tool calls (the approvals inbox)."""

    conversation_id: str
    turn_id: str
    agent: str
    input_text: str
    pending_approvals: list[ToolCall]
    parked_ms: int
    expires_ms: int
    decisions: dict[str, Decision] = Field(
        default_factory=dict, description="Decisions on some of its calls so far."
    )

    @classmethod
    def of(cls, parked: ParkedTurn) -> Approval:
        record = parked.record
        calls = (record.result or {}).get("pending_approvals") or []
        return cls(
            conversation_id=record.conversation_id,
            turn_id=record.turn_id,
            agent=record.agent,
            input_text=record.input.text[:2000],
            pending_approvals=[ToolCall.model_validate(c) for c in calls],
            parked_ms=parked.parked_ms,
            expires_ms=parked.expires_ms,
            decisions=record.decisions,
        )


class Approvals(BaseModel):
    now_ms: int = Field(description="The server's clock, to count down to expires_ms.")
    turns: list[Approval]


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    detail: str = ""

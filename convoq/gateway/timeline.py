"""A turn's timeline for the console: its steps, read from the events of its stream (and
its record and saved state), in the order they happened.

The stream says what happened and when (an event's id starts with the server's clock in
ms when its entry was written: events are sent in batches, so a time is that of the
batch, a few ms after the fact at most). From it:

- each model call (an ``assistant`` event): its answer, finish reason and the tokens it
  reported; the model and how long the call took when the worker recorded them; the
  turn's model settings from its record;
- each tool call (``tool_call``, then ``tool_result``): its arguments and result, how
  often it ran (a ``tool_call`` again for the same call id is a rerun after its run was cut
  off: same ``idempotency_key``) and the worker that ran it, when recorded;
- approvals (``approval_required``, then ``decision``: by whom, when, why);
- handoffs (``handoff``: the call, from which agent to which);
- runs (``status`` running), takeovers and resumptions (``resumed``: why, which attempt),
  parking, retries and the end, with the error of a failed turn.

A tool call's ``idempotency_key`` is the one its tool saw (:func:`convoq.context.idempotency_key`
of the model call that asked for it): the model call is found in the turn's messages (its
result, journal or continuation) and, where those are gone, counted from the events.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from convoq.context import idempotency_key
from convoq.messages import Decision, MessageRole
from convoq.pricing import Cost, PriceTable
from convoq.redis._inspect import TurnWhole
from convoq.turn_state import TurnEvent
from convoq.usage import Usage


class _Step(BaseModel):
    at_ms: int | None = Field(default=None, description="When its event was written (unix ms).")
    event_id: str = Field(default="", description="The id of the event it starts with.")


class StatusStep(_Step):
    """The turn's status changed: queued, parked for approval, queued again, or final."""

    kind: Literal["status"] = "status"
    status: str


class RunStep(_Step):
    """A run of the turn started on a worker (``attempt``: which run that counts)."""

    kind: Literal["run"] = "run"
    run: int


class ResumedStep(_Step):
    """A run went on with a turn another run started: a takeover after its worker was lost,
    cut off or stopped, a retry, or a resumption after approval."""

    kind: Literal["resumed"] = "resumed"
    reason: str
    attempt: int | None = None


class ModelCallStep(_Step):
    """One model call and its answer."""

    kind: Literal["model_call"] = "model_call"
    index: int = Field(description="The turn's model calls so far, this one included.")
    model: str | None = None
    latency_ms: int | None = None
    settings: dict[str, Any] | None = Field(default=None, description="As the turn asked.")
    finish_reason: str | None = None
    usage: Usage | None = None
    cost_usd: float | None = Field(default=None, description="At CONVOQ_MODEL_PRICES.")
    text: str = ""
    refusal: str | None = None
    worker: str | None = None


class ToolCallStep(_Step):
    """One tool call: what it was given, what it gave, how often it ran."""

    kind: Literal["tool_call"] = "tool_call"
    call_id: str
    name: str
    arguments: Any = None
    result: str | None = None
    runs: int = Field(default=1, description="Runs started; more than 1: rerun after a cut.")
    step: int | None = Field(default=None, description="The model call that asked for it.")
    idempotency_key: str | None = None
    worker: str | None = None
    finished_ms: int | None = None


class ApprovalStep(_Step):
    """A tool call that waited for a person's decision."""

    kind: Literal["approval"] = "approval"
    call_id: str
    name: str
    arguments: Any = None
    decision: Decision | None = None


class ErrorStep(_Step):
    """The turn ended with an error."""

    kind: Literal["error"] = "error"
    type: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class HandoffStep(_Step):
    """The turn went on with another agent (a ``transfer_to_<agent>`` call)."""

    kind: Literal["handoff"] = "handoff"
    call_id: str
    from_agent: str | None = None
    to_agent: str


class EventStep(_Step):
    """An event of a type this console does not know (shown as it is)."""

    kind: Literal["event"] = "event"
    type: str
    data: dict[str, Any] = Field(default_factory=dict)


Step = Annotated[
    StatusStep | RunStep | ResumedStep | ModelCallStep | ToolCallStep | ApprovalStep | ErrorStep
    | HandoffStep | EventStep,
    Field(discriminator="kind"),
]  # fmt: skip


def at_ms(event_id: str) -> int | None:
    """The server time (ms) a stream id starts with."""
    head = event_id.partition("-")[0]
    return int(head) if head.isdigit() else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class _Builder:
    """Steps from one turn's events, in order (see the module docstring)."""

    def __init__(self, whole: TurnWhole) -> None:
        self.whole = whole
        record = whole.record
        self.cid, self.tid = record.conversation_id, record.turn_id
        settings = record.options.get("model_settings")
        self.settings = settings if isinstance(settings, dict) else None
        self.steps: list[Step] = []
        self.calls: dict[str, ToolCallStep] = {}
        self.approvals: dict[str, ApprovalStep] = {}
        self.models = 0
        self.runs = 0
        self.step_of = _steps_of_calls(whole)
        self.last_ms: int | None = None

    def add(self, event_id: str, event: TurnEvent) -> None:
        when, data = at_ms(event_id), event.data
        handler = getattr(self, f"_on_{event.type}", None)
        if handler is not None:
            handler(event_id, when, data)
        else:
            self.steps.append(EventStep(at_ms=when, event_id=event_id, type=event.type, data=data))
        if event.type != "text_delta":
            self.last_ms = when

    def _on_status(self, eid: str, when: int | None, data: dict[str, Any]) -> None:
        status = str(data.get("status", ""))
        if status == "running":
            self.runs += 1
            self.steps.append(RunStep(at_ms=when, event_id=eid, run=self.runs))
        else:
            self.steps.append(StatusStep(at_ms=when, event_id=eid, status=status))

    def _on_done(self, eid: str, when: int | None, data: dict[str, Any]) -> None:
        return None  # the final status event before it says it

    def _on_text_delta(self, eid: str, when: int | None, data: dict[str, Any]) -> None:
        return None  # the assistant event after them carries the whole text

    def _on_resumed(self, eid: str, when: int | None, data: dict[str, Any]) -> None:
        reason = str(data.get("reason", ""))
        self.steps.append(ResumedStep(at_ms=when, event_id=eid, reason=reason,
                                      attempt=_int(data.get("attempt"))))  # fmt: skip

    def _on_handoff(self, eid: str, when: int | None, data: dict[str, Any]) -> None:
        self.steps.append(HandoffStep(
            at_ms=when, event_id=eid, call_id=str(data.get("call_id") or ""),
            from_agent=_text(data.get("from")), to_agent=str(data.get("to") or ""),
        ))  # fmt: skip

    def _on_assistant(self, eid: str, when: int | None, data: dict[str, Any]) -> None:
        self.models += 1
        latency = _int(data.get("latency_ms"))
        usage = data.get("usage")
        self.steps.append(ModelCallStep(
            at_ms=when, event_id=eid, index=self.models, model=_text(data.get("model")),
            latency_ms=latency, settings=self.settings,
            finish_reason=_text(data.get("finish_reason")),
            usage=Usage.model_validate(usage) if isinstance(usage, dict) else None,
            text=str(data.get("text") or ""), refusal=_text(data.get("refusal")),
            worker=_text(data.get("worker")),
        ))  # fmt: skip

    def _on_tool_call(self, eid: str, when: int | None, data: dict[str, Any]) -> None:
        call_id = str(data.get("id", ""))
        known = self.calls.get(call_id)
        if known is not None:
            known.runs += 1  # the same call again: its earlier run was cut off
            known.worker = _text(data.get("worker")) or known.worker
            return
        step = self.step_of.get(call_id, self.models or None)
        key = idempotency_key(self.cid, self.tid, step, call_id) if step else None
        call = ToolCallStep(at_ms=when, event_id=eid, call_id=call_id,
                            name=str(data.get("name", "")), arguments=data.get("arguments"),
                            step=step, idempotency_key=key,
                            worker=_text(data.get("worker")))  # fmt: skip
        self.calls[call_id] = call
        self.steps.append(call)

    def _on_tool_result(self, eid: str, when: int | None, data: dict[str, Any]) -> None:
        call = self.calls.get(str(data.get("id", "")))
        if call is not None:
            call.result = str(data.get("result", ""))
            call.finished_ms = when

    def _on_approval_required(self, eid: str, when: int | None, data: dict[str, Any]) -> None:
        call_id = str(data.get("id", ""))
        name, arguments = str(data.get("name", "")), data.get("arguments")
        asked = ApprovalStep(
            at_ms=when, event_id=eid, call_id=call_id, name=name, arguments=arguments
        )
        self.approvals[call_id] = asked
        self.steps.append(asked)

    def _on_decision(self, eid: str, when: int | None, data: dict[str, Any]) -> None:
        call_id = str(data.get("call_id", ""))
        fields = {k: v for k, v in data.items() if k != "call_id"}
        decision = Decision.model_validate({"at_ms": when, **fields})
        asked = self.approvals.get(call_id)
        if asked is not None:
            asked.decision = decision
        else:
            self.steps.append(EventStep(at_ms=when, event_id=eid, type="decision", data=data))

    def finish(self) -> list[Step]:
        """The steps, with the record's decisions where the events lack them and the error
        of a turn that failed."""
        record = self.whole.record
        for call_id, decision in record.decisions.items():
            asked = self.approvals.get(call_id)
            if asked is not None and asked.decision is None:
                asked.decision = decision
        if record.error:
            error = record.error
            details = error.get("details")
            self.steps.append(ErrorStep(
                at_ms=record.finished_ms, type=str(error.get("type", "Error")),
                message=str(error.get("message", "")),
                details=details if isinstance(details, dict) else {},
            ))  # fmt: skip
        return self.steps


def _steps_of_calls(whole: TurnWhole) -> dict[str, int]:
    """Call id -> the model call (1, 2, ...) that asked for it, from the turn's messages:
    those its result stored, else its journal or continuation."""
    raw = (whole.record.result or {}).get("messages")
    messages: list[Any] = raw if isinstance(raw, list) else []
    if not messages and whole.state is not None:
        messages = [m.model_dump(mode="json") for m in whole.state.messages]
    found: dict[str, int] = {}
    models = 0
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != MessageRole.ASSISTANT.value:
            continue
        models += 1
        for call in message.get("tool_calls") or []:
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                found[call["id"]] = models
    return found


def timeline(whole: TurnWhole) -> list[Step]:
    """The steps of the turn ``whole`` (see the module docstring)."""
    builder = _Builder(whole)
    for event_id, event in whole.events:
        builder.add(event_id, event)
    return builder.finish()


def priced(steps: list[Step], prices: PriceTable) -> Cost | None:
    """Set each model call's ``cost_usd`` at ``prices`` and answer the turn's cost by
    model (None without a price table: tokens only)."""
    if not prices:
        return None
    by_model: dict[str, Usage] = {}
    for step in steps:
        if isinstance(step, ModelCallStep) and step.model and step.usage is not None:
            price = prices.price_of(step.model)
            step.cost_usd = price.cost(step.usage) if price is not None else None
            by_model[step.model] = by_model.get(step.model, Usage()) + step.usage
    return prices.cost(by_model)

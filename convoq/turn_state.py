"""The data of a turn in flight, shared by the engine, the store and the memory: the
turn so far (:class:`TurnState`, what the step journal and continuations persist), its
events (:class:`TurnEvent`) and the decisions on tool calls that wait for approval
(:class:`Decision`). Data only: the loop that moves a turn on is :mod:`convoq.engine`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from convoq.errors import ConvoqError
from convoq.messages import Decision, Message, MessageRole, ToolCall

__all__ = ["Decision", "TurnEvent", "TurnState", "Wait", "answered", "expire_undecided"]

EventType = Literal[
    "status",
    "resumed",
    "retried",
    "text_delta",
    "text_retracted",
    "assistant",
    "tool_call",
    "tool_result",
    "approval_required",
    "subagent_call",
    "decision",
    "deferred",
    "result_supplied",
    "signal_delivered",
    "guardrail_tripped",
    "handoff",
    "stop_requested",
    "merged",
    "done",
]


class TurnEvent(BaseModel):
    """Something that happened during a turn: the unit of ``stream`` and ``events``.

    ``resumed`` (queued turns) marks a run that goes on with a turn an earlier run started:
    ``data["reason"]`` says why (``worker_lost``: the run's lease lapsed, its worker died
    or stalled, and a new run took the turn over; ``worker_cut_off``: the same, but its
    worker lived and reported the run lost (cut off from Redis); ``worker_stopped``: its
    worker handed it back on shutdown; ``retried``: the turn failed and was retried;
    ``approval_decided`` / ``approval_expired``: a parked turn goes on after its
    approvals), ``data["attempt"]`` which attempt the run is (a resume after approvals goes
    on with the attempt that parked). Steps the earlier run finished are not repeated; a
    step it was cut off in (a ``tool_call`` without its ``tool_result``) is.

    ``text_retracted`` (``{"reason": "model_retry", "retry": n}``): the model call's
    stream dropped part way and the call is sent again; the ``text_delta`` text since that
    call began (since the last ``assistant`` or ``tool_result``, or the turn's start) is
    void, and streams again from its start. The final text is the ``done``'s, as always.

    ``assistant`` (a model call answered) carries its ``text``, the ``finish_reason``,
    ``usage`` and ``refusal`` the model reported, and from the turn loop the ``model``
    that answered and the call's ``latency_ms``. On a worker, ``assistant``,
    ``tool_call`` and ``tool_result`` also name the worker that ran the step (``worker``:
    the id it holds leases as, ``host:pid``).

    ``subagent_call`` (the call, ``agent``, and the child turn's ``conversation_id`` and
    ``turn_id``) says a sub-agent call waits for its child turn (:mod:`convoq.subagents`).

    ``handoff`` (``{"call_id", "from", "to"}``) says the turn goes on as the agent ``to``
    (:mod:`convoq.handoffs`).

    ``deferred`` (``{"call_id", "name", "on", "signal", "timeout_s", "metadata"}``) says
    a tool call waits for the world (:mod:`convoq.waits`): a result posted from outside
    (``on`` "result") or the signal named ``signal`` (``on`` "signal").
    ``result_supplied`` and ``signal_delivered`` (``{"call_id", "by", "at_ms", ...}``)
    say what ended such a wait; a wait whose deadline passed gets a ``decision`` with
    ``expired`` true.

    ``guardrail_tripped`` (``{"guardrail", "kind", "reason", "info"}``) comes before the
    ``done`` of a turn a guardrail blocked (:mod:`convoq.guardrails`).

    Double texting (docs/double-texting.md): ``stop_requested`` (``{"mode", "by"}``) says
    a newer turn ``by`` was submitted with ``if_busy`` ``mode`` (``"interrupt"`` or
    ``"rollback"``) while this one ran; ``merged`` (``{"turn_id"}``) that the message of
    that submit joined this queued turn.

    ``retried`` (``{"retry": n}``) follows the ``done`` of a failed turn that was retried:
    the turn is queued again, and its events go on to a second ``done``.
    """

    type: EventType
    data: dict[str, Any] = Field(default_factory=dict)


class Wait(BaseModel):
    """What a parked tool call waits for besides a person (:mod:`convoq.waits`): ``on``
    "result" (a deferred call's result, posted from outside) or "signal" (the signal
    ``name`` of the turn's conversation); ``timeout_s``: how long at most (None: the
    agent's approval expiry); ``metadata``: a JSON object shown to operators."""

    model_config = ConfigDict(frozen=True)
    on: Literal["result", "signal"]
    name: str | None = None
    timeout_s: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class TurnState(BaseModel):
    """The turn so far, starting with its user message: what continuations and the step
    journal persist."""

    messages: list[Message]
    steps: int = 0
    pending: list[ToolCall] = Field(default_factory=list)
    decisions: dict[str, Decision] = Field(default_factory=dict)
    # Some call's approval expired: once its calls are answered the turn ends (as expired).
    expired: bool = False
    # The pending calls that wait for the world (a result or a signal), by call id.
    waits: dict[str, Wait] = Field(default_factory=dict)

    @classmethod
    def start(cls, message: Message) -> TurnState:
        return cls(messages=[message])

    def decide(self, call_id: str, decision: Decision | bool, reason: str | None = None) -> None:
        """Record the decision on a pending call (a bool: approved or not, with ``reason``)."""
        if isinstance(decision, bool):
            decision = Decision(approved=decision, reason=reason)
        if call_id not in {c.id for c in self.pending}:
            raise ConvoqError(
                f"no pending tool call {call_id!r}; pending: {[c.id for c in self.pending]}",
                call_id=call_id,
            )
        self.decisions[call_id] = decision

    @property
    def undecided(self) -> list[ToolCall]:
        return [c for c in self.pending if c.id not in self.decisions]


def expire_undecided(state: TurnState, at_ms: int) -> list[TurnEvent]:
    """Decide every pending call no one decided as expired (its approval ran out at
    ``at_ms``); the "decision" events that say so."""
    events = []
    for call in state.undecided:
        decision = Decision(approved=False, at_ms=at_ms, expired=True)
        state.decisions[call.id] = decision
        events.append(
            TurnEvent(type="decision", data={"call_id": call.id, **decision.model_dump()})
        )
    return events


def answered(state: TurnState) -> bool:
    """The model gave its final answer: the turn loop ends with this state."""
    last = state.messages[-1]
    return last.role == MessageRole.ASSISTANT and not last.tool_calls and not state.pending

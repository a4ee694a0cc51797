"""What an Agent call returns, and the JSON-serialisable continuation of a paused turn.

Named ``agent_response`` (it was ``convoq.responses``) so it is not taken for
:mod:`convoq.models.responses`, the model of OpenAI's Responses API: this module is the
Agent's :class:`Response`, which ``convoq.Response`` exports.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from convoq.errors import ConvoqError
from convoq.messages import Message, ToolCall
from convoq.model_settings import ModelSettings
from convoq.models.base import OutputSpec
from convoq.turn_state import Decision, TurnState
from convoq.usage import Usage

CONTINUATION_VERSION = 1


class Continuation(BaseModel):
    """A paused turn, JSON-serialisable: pass it to :meth:`Agent.resume` or ``discard``.
    ``expires_ms``: when its approval expires (unix ms); it is refused after that.
    ``metadata``: the call's metadata, which the resumed turn's tools see again; ``token``
    is the turn's id in its tools' contexts (so idempotency keys hold across a resume)."""

    # "model_settings" is a field, not pydantic API (pydantic < 2.10 would warn).
    model_config = ConfigDict(protected_namespaces=())

    version: int = CONTINUATION_VERSION
    token: str
    conversation_id: str | None = None
    agent: str | None = None
    keep_last_turns: int = 0
    max_history_tokens: int | None = None
    uses_memory: bool = True
    history: list[Message] = Field(default_factory=list)
    state: TurnState
    expires_ms: int | None = None
    # What the turn asks of the model, kept so a resumed turn asks the same.
    output: OutputSpec | None = None
    model_settings: ModelSettings | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def pending(self) -> list[ToolCall]:
        return self.state.undecided


class Response(BaseModel):
    """What a call returns. ``turn`` holds the messages this call added, its input first.

    ``status`` "waiting": every call of the paused turn waits for the world (a tool raised
    :class:`~convoq.CallDeferred` or :class:`~convoq.WaitForSignal`); ``waiting_for``
    lists those calls (the ``deferred`` event's data: ``call_id``, ``name``, ``on``,
    ``signal``, ``timeout_s``, ``metadata``), which ``resume`` answers with their
    results; ``pending_approvals`` only the calls a person decides.

    ``usage``: tokens the turn's model calls reported, summed (``requests``: the calls
    made; all counts 0 when the server reports none). ``finish_reason``: why the final
    model call stopped (``"length"``: the answer was cut off at the token limit).
    ``refusal``: the model's refusal text when it refused instead of answering (``text``
    is then usually empty). ``output``: with an output type, the validated answer as that
    type gives it (a model instance, a dataclass, a dict for a JSON schema); ``text`` is
    the answer as the model sent it, which is also what is stored. ``output_data``: the
    same as JSON. ``children``: the child turns its sub-agent calls made (call, agent,
    child conversation and turn ids, status, usage), whose usage ``usage`` includes, as
    on workers. ``agent``: the name of the agent that answered (after a handoff, the one
    the turn was handed to last; see :mod:`convoq.handoffs`).
    """

    text: str
    turn: list[Message]
    status: Literal["completed", "awaiting_approval", "waiting"]
    conversation_id: str | None = None
    pending_approvals: list[ToolCall] = Field(default_factory=list)
    waiting_for: list[dict[str, Any]] = Field(default_factory=list)
    continuation: Continuation | None = None
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str | None = None
    refusal: str | None = None
    output: Any = None
    output_data: Any = None
    children: list[ChildTurnData] = Field(default_factory=list)
    agent: str | None = None


class ChildTurnData(BaseModel):
    """A sub-agent call's child turn, as the parent's answer lists it."""

    call_id: str
    agent: str
    conversation_id: str
    turn_id: str
    status: str
    usage: Usage = Field(default_factory=Usage)


Response.model_rebuild()


def parse_continuation(value: Continuation | dict[str, Any] | str) -> Continuation:
    try:
        if isinstance(value, Continuation):
            cont = value.model_copy(deep=True)
        elif isinstance(value, str):
            cont = Continuation.model_validate_json(value)
        else:
            cont = Continuation.model_validate(value)
    except ValidationError as exc:
        raise ConvoqError(
            f"not a continuation ({exc.error_count()} problems, first: {exc.errors()[0]['msg']});"
            " pass the continuation of an awaiting_approval Response, or its JSON, unchanged"
        ) from None
    if cont.version != CONTINUATION_VERSION:
        raise ConvoqError(
            f"continuation version {cont.version} is not supported (expected"
            f" {CONTINUATION_VERSION}); discard it and run the turn again"
        )
    return cont


def parse_decision(value: Any, *, by: str | None, at_ms: int) -> Decision:
    """``True``/``False`` or a :class:`Decision`, stamped with who (``by``, unless the
    Decision names someone) and when (``at_ms``, unless it has a time)."""
    if isinstance(value, bool):
        return Decision(approved=value, by=by, at_ms=at_ms)
    if isinstance(value, Decision):
        return value.model_copy(
            update={"by": value.by or by, "at_ms": value.at_ms or at_ms, "expired": False}
        )
    raise ConvoqError("a decision is True (approve), False (deny) or a Decision with a reason")

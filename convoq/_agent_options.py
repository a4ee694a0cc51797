"""What a turn of the in-process :class:`~convoq.agent.Agent` asks for, decided once before
anything runs: the answer's shape and the model settings (the agent's, a call's merged over
them), the history window a call may override, the call's metadata, and the loop the turn
runs on. The Agent's own options are checked here too. No I/O.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from convoq import defaults
from convoq.agent_response import Continuation
from convoq.approvals import ApprovalRule
from convoq.context import Instructions, TurnScope
from convoq.engine import EventSink, TurnLoop
from convoq.errors import ConvoqError
from convoq.guardrails import InputGuardrail, OutputGuardrail
from convoq.handoffs import check_inline as check_handoffs_inline
from convoq.handoffs import handoffs_of, max_handoffs
from convoq.memory.base import ConversationMemory
from convoq.messages import Message
from convoq.model_settings import (
    ModelSettings,
    SettingsLike,
    check_tool_choice,
    coerce_settings,
    merge_settings,
)
from convoq.models.base import Model, OutputSpec
from convoq.output import OutputShape, OutputType, output_shape, shape_for
from convoq.subagents import check_inline
from convoq.tools import ToolRegistry
from convoq.window import Window, WindowRule, WindowSettings, check_budget

DEFAULT_BUSY_TIMEOUT_S = 30.0


class AgentOptions(Protocol):
    """What an agent says its turns run with: attributes of :class:`convoq.Agent`, read
    when a turn starts (they may be set after the agent is made)."""

    @property
    def model(self) -> Model: ...

    @property
    def tools(self) -> ToolRegistry: ...

    @property
    def instructions(self) -> Instructions | None: ...

    @property
    def name(self) -> str | None: ...

    @property
    def max_steps(self) -> int: ...

    @property
    def fail_on_length(self) -> bool: ...

    @property
    def approval_policy(self) -> ApprovalRule: ...

    @property
    def output(self) -> OutputShape | None: ...

    @property
    def output_retries(self) -> int: ...

    @property
    def model_settings(self) -> ModelSettings | None: ...

    @property
    def input_guardrails(self) -> tuple[InputGuardrail, ...]: ...

    @property
    def output_guardrails(self) -> tuple[OutputGuardrail, ...]: ...


class ConversationOwner(AgentOptions, Protocol):
    """What holding an agent's conversation reads of it (in process, and when a worker
    checks a profile): its memory and conversation, how a busy one is met, its deps."""

    @property
    def memory(self) -> ConversationMemory | None: ...

    @property
    def conversation_id(self) -> str | None: ...

    @property
    def if_busy(self) -> str: ...

    @property
    def busy_timeout_s(self) -> float: ...

    async def provided_deps(self) -> Any: ...


def check_options(
    *,
    if_busy: str,
    busy_timeout_s: float,
    approval_ttl_s: float | None,
    keep_last_turns: int,
    max_steps: int,
    output_retries: int,
) -> None:
    """The Agent's own options that nothing else checks, before it is made.

    Raises:
        ConvoqError: the first option out of its range, saying what it must be.
    """
    if if_busy in ("interrupt", "rollback", "merge", "queue"):
        raise ConvoqError(
            f"Agent(if_busy={if_busy!r}) is not supported: an in-process Agent runs one"
            " turn at a time in its caller and keeps no queue, so it has no turn to"
            " interrupt, roll back or merge into; use if_busy='reject' or 'wait' here, or"
            f" submit through a Client (client.submit(..., if_busy={if_busy!r}),"
            " docs/double-texting.md)"
        )
    if if_busy not in ("reject", "wait"):
        raise ConvoqError(f"if_busy must be 'reject' or 'wait', not {if_busy!r}")
    if not busy_timeout_s >= 0 or (approval_ttl_s is not None and not approval_ttl_s > 0):
        raise ConvoqError("busy_timeout_s must be >= 0 and approval_ttl_s > 0")
    if keep_last_turns < 0:
        raise ConvoqError("keep_last_turns must be >= 0 (0 sends the whole history)")
    if max_steps < 1:
        raise ConvoqError("max_steps must be >= 1")
    if isinstance(output_retries, bool) or not isinstance(output_retries, int):
        raise ConvoqError("output_retries must be an int >= 0")
    if output_retries < 0:
        raise ConvoqError("output_retries must be >= 0 (0: no retry)")


class Asked(NamedTuple):
    """What a call asks of the model: the answer's shape and the settings."""

    shape: OutputShape | None
    settings: ModelSettings | None

    @property
    def spec(self) -> OutputSpec | None:
        return self.shape.spec if self.shape is not None else None


class Limits(NamedTuple):
    """A call's overrides of the agent's window (None: the agent's), and its metadata."""

    keep_last_turns: int | None
    max_history_tokens: int | None
    metadata: dict[str, Any]


def tool_names(agent: AgentOptions) -> list[str]:
    """The names a ``tool_choice`` may pick: the agent's tools (MCP tools included)."""
    return [spec.name for spec in agent.tools.specs()]


def asked(
    agent: AgentOptions, output_type: OutputType | None, settings: SettingsLike | None
) -> Asked:
    """A call's output shape and settings (checked before anything runs); sub-agents
    named only by profile cannot run in process (ConfigurationError)."""
    check_inline(agent.tools)
    check_handoffs_inline(agent.tools)
    shape = output_shape(output_type) if output_type is not None else agent.output
    merged = merge_settings(agent.model_settings, coerce_settings(settings))
    check_tool_choice(merged, tool_names(agent))
    return Asked(shape, merged)


def resumed_shape(
    agent: AgentOptions, cont: Continuation, given: OutputShape | None
) -> OutputShape | None:
    """The output shape a resumed turn started with, typed where a type is known (the
    ``given`` one's, else the agent's when the spec is the agent's, else JSON)."""
    return None if cont.output is None else shape_for(cont.output, given, agent.output)


def call_window(agent: WindowSettings, limits: Limits) -> Window:
    """The window a call's turn is sent with: its overrides over the agent's settings."""
    if limits.keep_last_turns is not None and limits.keep_last_turns < 0:
        raise ConvoqError("keep_last_turns must be >= 0 (0 sends the whole history)")
    budget = check_budget(limits.max_history_tokens)
    return WindowRule.of(agent).window(limits.keep_last_turns, budget)


def loop_of(
    agent: AgentOptions,
    history: list[Message],
    scope: TurnScope,
    settings: ModelSettings | None,
    output: OutputShape | None,
    emit: EventSink,
) -> TurnLoop:
    """The turn loop of ``agent`` for one run of a turn, in process or on a worker."""
    return TurnLoop(
        model=agent.model, tools=agent.tools, history=history,
        instructions=agent.instructions, max_steps=agent.max_steps, emit=emit,
        fail_on_length=agent.fail_on_length, scope=scope,
        approval_policy=agent.approval_policy, settings=settings, output=output,
        output_retries=agent.output_retries, input_guardrails=agent.input_guardrails,
        output_guardrails=agent.output_guardrails,
        max_handoffs=max_handoffs() if handoffs_of(agent.tools) else defaults.MAX_HANDOFFS,
    )  # fmt: skip

"""The profile interface: what a worker needs from an agent to run one of its turns.

A worker runs named profiles; it knows each only through :class:`AgentProfile`: the
history settings the store reads the window with, and :meth:`AgentProfile.run_turn`, which
takes a :class:`TurnJob` (the turn so far, its history window and the hooks the worker
journals and streams through) and returns the engine's outcome. convoq's own
:class:`~convoq.agent.Agent` is one; ``convoq.integrations`` adapt other frameworks' agents.

Two members are optional (read with :func:`approval_ttl_of` and :func:`refusals_of`, so a
profile written before them still is one): ``approval_ttl_s``, how long a turn of the
profile parked for approval waits (None or absent: the worker's ``CONVOQ_APPROVAL_TTL_S``),
and ``worker_refusals()``, the options set on the profile that a worker cannot honour,
each with what to do instead: a worker refuses to start with such a profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from convoq.compaction import CompactionPolicy
from convoq.engine import Checkpoint, EventSink, Outcome, StopCheck
from convoq.messages import Message
from convoq.subagents import Children
from convoq.tokens import TokenCounter
from convoq.turn_state import TurnState


@dataclass
class TurnJob:
    """One run of a turn on a worker. ``state``: the turn so far (its user message alone,
    or what the step journal or a continuation kept); ``history``: the window before it.
    ``checkpoint`` journals a state (fenced): a rerun starts from the last one;
    ``emit`` streams an event; ``should_stop`` says the turn was cancelled."""

    conversation_id: str
    turn_id: str
    agent: str
    state: TurnState
    history: list[Message]
    emit: EventSink
    checkpoint: Checkpoint
    should_stop: StopCheck
    metadata: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1
    # What the submitter asked of the model for this turn (``model_settings``, ``output``
    # as JSON, from the turn record): the profile merges them over its own.
    options: dict[str, Any] = field(default_factory=dict)
    # How the turn's sub-agent calls run on this worker: as child turns it parks for.
    children: Children | None = None
    # The turn was handed to this agent (:mod:`convoq.handoffs`): its answers carry its name.
    handed: bool = False


@runtime_checkable
class AgentProfile(Protocol):
    """An agent a worker can run by name."""

    name: str | None
    keep_last_turns: int
    max_history_tokens: int | None
    token_counter: TokenCounter | None
    compaction: CompactionPolicy | None

    async def run_turn(self, job: TurnJob) -> Outcome:
        """Run the turn on from ``job.state`` until it completes or parks for approval."""
        ...


def approval_ttl_of(profile: AgentProfile) -> float | None:
    """The profile's own approval ttl in seconds (None: the worker's setting)."""
    value = getattr(profile, "approval_ttl_s", None)
    return None if value is None else float(value)


def refusals_of(profile: AgentProfile) -> dict[str, str]:
    """The options of ``profile`` a worker cannot honour, each with what to do instead."""
    refusals = getattr(profile, "worker_refusals", None)
    return dict(refusals()) if callable(refusals) else {}

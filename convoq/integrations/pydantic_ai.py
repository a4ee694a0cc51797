"""Pydantic AI agents as convoq worker profiles (the ``convoq[pydantic-ai]`` extra).

``durable(agent)`` makes a named ``pydantic_ai.Agent`` a profile workers run by that name
(a named Pydantic AI agent in the agents module is wrapped as it is). Each turn gives the
agent the conversation's history window as ``message_history`` and commits the run's new
messages as the turn; every model response and tool result is a journaled step, so a
worker killed mid-turn leaves the next one to go on from there; a tool that requires
approval parks the turn until ``approve``/``deny``, and one that raises Pydantic AI's
``CallDeferred`` until ``complete_call`` supplies its result; they resume it with Pydantic
AI's own deferred tool results (:mod:`._pydantic_ai_deferred`). What a submit asks of the
turn (``model_settings``, an output schema, ``metadata``) becomes the run's own arguments
(:mod:`._pydantic_ai_options`). See the README section "Pydantic AI agents on workers".

Guardrails map as they run on a convoq Agent: ``input_guardrails`` check the user message
before the run starts, ``output_guardrails`` the run's output (typed, or its text) before
the turn is stored; a tripped one blocks the turn (:mod:`convoq.guardrails`). An input
guardrail beside the first model call (``run_in_parallel``) is refused: the run journals
its first model response itself, before a guardrail beside it could discard it. Pydantic
AI's own output validators stay what they are there, retries the model reads (ModelRetry),
never trips.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from convoq.errors import ConfigurationError

try:
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai import DeferredToolRequests
    from pydantic_ai.exceptions import UnexpectedModelBehavior, UserError
except ImportError as exc:  # pragma: no cover - the extra is installed in tests
    raise ConfigurationError(
        "convoq.integrations.pydantic_ai needs Pydantic AI: pip install 'convoq[pydantic-ai]'"
    ) from exc

from pydantic_core import to_jsonable_python

from convoq.compaction import CompactionPolicy
from convoq.context import DepsHolder, TurnScope
from convoq.engine import Completed, Outcome, Paused
from convoq.guardrails import (
    InputGuardrail,
    check_all,
    input_guardrails_of,
    output_guardrails_of,
)
from convoq.integrations._pydantic_ai_deferred import deferred_results, parked
from convoq.integrations._pydantic_ai_journal import JournalCapability, TurnJournal
from convoq.integrations._pydantic_ai_messages import (
    is_journal_entry,
    to_convoq,
    to_pydantic_ai,
    user_prompt,
)
from convoq.integrations._pydantic_ai_options import asked_of
from convoq.messages import Message
from convoq.output import TypedOutput
from convoq.profile import TurnJob
from convoq.tokens import TokenCounter
from convoq.usage import Usage
from convoq.waits import WaitRequest
from convoq.window import check_budget

__all__ = ["DurableAgent", "durable"]


class DurableAgent:
    """A Pydantic AI agent as a convoq profile (see :func:`durable`)."""

    def __init__(
        self,
        agent: PydanticAgent[Any, Any],
        *,
        name: str | None = None,
        keep_last_turns: int = 0,
        max_history_tokens: int | None = None,
        token_counter: TokenCounter | None = None,
        deps: Any = None,
        deps_factory: Callable[[], Any] | None = None,
        approval_ttl_s: float | None = None,
        input_guardrails: Iterable[Any] = (),
        output_guardrails: Iterable[Any] = (),
    ) -> None:
        if not isinstance(agent, PydanticAgent):
            raise ConfigurationError(
                f"durable() takes a pydantic_ai.Agent, not {type(agent).__name__}"
            )
        self.name = name or agent.name
        if not self.name:
            raise ConfigurationError(
                "a profile needs a name: pydantic_ai.Agent(..., name='...') or durable(agent,"
                " name='...')"
            )
        if keep_last_turns < 0:
            raise ConfigurationError("keep_last_turns must be >= 0 (0 sends the whole history)")
        max_history_tokens = check_budget(max_history_tokens)
        if approval_ttl_s is not None and not approval_ttl_s > 0:
            raise ConfigurationError("approval_ttl_s must be > 0 (None: the workers' setting)")
        self.approval_ttl_s = approval_ttl_s
        self.agent = agent
        self.keep_last_turns = keep_last_turns
        self.max_history_tokens = max_history_tokens
        self.token_counter = token_counter
        self.compaction: CompactionPolicy | None = None
        self._deps = DepsHolder(deps, deps_factory)
        self.input_guardrails = _input_guardrails(self.name, input_guardrails)
        self.output_guardrails = output_guardrails_of(
            output_guardrails, f"the Pydantic AI profile {self.name!r}"
        )

    async def provided_deps(self) -> Any:
        """``deps``, or what ``deps_factory`` made in this process."""
        return await self._deps.get()

    async def run_turn(self, job: TurnJob) -> Outcome:
        """Run (or go on with) the turn: the worker's side of the profile interface."""
        state = job.state
        history = to_pydantic_ai(job.history)
        started = any(m.framework for m in state.messages)
        base = [m for m in state.messages if not is_journal_entry(m)] if started else []
        so_far = history + (to_pydantic_ai(base) if started else [])
        journal = TurnJournal(job, base, len(so_far))
        prompt = None if started else user_prompt(state.messages[0])
        if not started:
            await self._guard(job, self.input_guardrails, state.messages[0], 0)
        result = await self._run(job, prompt, so_far, JournalCapability(journal))
        messages = base + to_convoq(result.new_messages(), journal.audit)
        steps = journal.steps
        if isinstance(result.output, DeferredToolRequests):
            return await self._park(job, result.output, messages, steps)
        await self._guard(job, self.output_guardrails, result.output, steps)
        data = _jsonable(result.output)
        return Completed(messages, steps, output=TypedOutput(result.output, data))

    async def _guard(self, job: TurnJob, guardrails: Any, value: Any, step: int) -> None:
        """Run ``guardrails`` on ``value`` in the turn's context (raise GuardrailTripped)."""
        if guardrails:
            deps = await self.provided_deps()
            scope = TurnScope(job.conversation_id, job.turn_id, job.agent, deps, job.metadata,
                              attempt=job.attempt)  # fmt: skip
            await check_all(guardrails, scope.context(step, Usage()), value, job.emit)

    async def _run(
        self, job: TurnJob, prompt: Any, so_far: list[Any], journaled: JournalCapability
    ) -> Any:
        """One run of the agent with what the turn asks (its options as run arguments)."""
        asked = asked_of(str(self.name), self.agent.model_settings, job.options)
        check = asked.output
        try:
            return await self.agent.run(
                prompt,
                message_history=so_far or None,
                deferred_tool_results=deferred_results(job.state),
                output_type=self._output_type(None if check is None else check.output_type()),
                deps=await self.provided_deps(),
                model_settings=asked.model_settings,
                metadata=dict(job.metadata) if job.metadata else None,
                capabilities=[journaled] if check is None else [journaled, check],
            )
        except UnexpectedModelBehavior as exc:
            exhausted = None if check is None else check.exhausted(str(self.name))
            if exhausted is not None:
                raise exhausted from exc
            raise
        except UserError as exc:
            if "output validators" not in str(exc):
                raise
            raise self._validators_refused(asked=check is not None) from exc
        except WaitRequest as exc:
            raise ConfigurationError(
                f"a tool of the Pydantic AI profile {self.name!r} raised convoq's"
                f" {type(exc).__name__}, which a Pydantic AI run cannot park on: raise"
                " pydantic_ai's CallDeferred for a result from outside (signals are"
                " convoq tools' only)",
                profile=self.name,
            ) from exc

    def _output_type(self, asked: Any = None) -> Any:
        """The run's output type: the turn's, else the agent's own (None) when it already
        takes a parked run's requests for approval, else the agent's with those."""
        if asked is not None:
            return [asked, DeferredToolRequests]
        declared = self.agent.output_type
        kinds = declared if isinstance(declared, list | tuple) else [declared]
        return None if DeferredToolRequests in kinds else [*kinds, DeferredToolRequests]

    def _validators_refused(self, *, asked: bool) -> ConfigurationError:
        """Pydantic AI runs an agent's output validators only with its own output type."""
        if asked:
            return ConfigurationError(
                f"the Pydantic AI profile {self.name!r} has output validators, which"
                " Pydantic AI runs only with the agent's own output type: submit no"
                " output_schema to it",
                profile=self.name,
                option="output_schema",
            )
        return ConfigurationError(
            f"the Pydantic AI profile {self.name!r} has output validators, which Pydantic"
            " AI runs only with the agent's own output type, and a parked turn needs"
            " DeferredToolRequests in it: declare output_type=[YourType,"
            " DeferredToolRequests] on the agent",
            profile=self.name,
            option="output_type",
        )

    async def _park(
        self, job: TurnJob, requests: DeferredToolRequests, messages: list[Message], steps: int
    ) -> Paused:
        return await parked(requests, messages, steps, job.emit)


def durable(
    agent: PydanticAgent[Any, Any],
    *,
    name: str | None = None,
    keep_last_turns: int = 0,
    max_history_tokens: int | None = None,
    token_counter: TokenCounter | None = None,
    deps: Any = None,
    deps_factory: Callable[[], Any] | None = None,
    approval_ttl_s: float | None = None,
    input_guardrails: Iterable[Any] = (),
    output_guardrails: Iterable[Any] = (),
    handoffs: Iterable[Any] = (),
) -> DurableAgent:
    """A Pydantic AI agent as a convoq worker profile, named ``name`` or ``agent.name``.

    Args:
        agent: the ``pydantic_ai.Agent`` (its model, tools, instructions, output type).
        keep_last_turns: previous turns given as its message history (0: all).
        max_history_tokens: at most this many tokens of history (whole turns), counted by
            ``token_counter`` (None: recorded usage, else an estimate).
        deps: the ``deps`` of every run; ``deps_factory`` instead makes them once per
            worker process.
        approval_ttl_s: how long a turn parked for approval waits for its decisions
            (None: the workers' ``CONVOQ_APPROVAL_TTL_S``).
        input_guardrails: checks of the user message before the run (see the module:
            none may ``run_in_parallel``); ``output_guardrails``: checks of its output.
        handoffs: refused when given: Pydantic AI has no handoff (its agent delegation
            and programmatic hand-off are application code); hand off between convoq
            ``Agent`` profiles (``handoffs=[...]``, :mod:`convoq.handoffs`).

    Raises:
        ConfigurationError: not a Pydantic AI agent, no name, bad settings, an input
            guardrail that runs in parallel, or ``handoffs``.
    """
    if list(handoffs):
        raise ConfigurationError(
            "a Pydantic AI profile cannot hand off (handoffs): Pydantic AI has no handoff;"
            " its agent delegation is a sub-agent (give it to a convoq Agent's subagents),"
            " and handoffs run between convoq Agent profiles",
            option="handoffs",
            profile=name or getattr(agent, "name", None),
        )
    return DurableAgent(
        agent,
        name=name,
        keep_last_turns=keep_last_turns,
        max_history_tokens=max_history_tokens,
        token_counter=token_counter,
        deps=deps,
        deps_factory=deps_factory,
        approval_ttl_s=approval_ttl_s,
        input_guardrails=input_guardrails,
        output_guardrails=output_guardrails,
    )


def _input_guardrails(profile: str, given: Iterable[Any]) -> tuple[InputGuardrail, ...]:
    """The profile's input guardrails; one that runs in parallel is refused (see the module)."""
    owner = f"the Pydantic AI profile {profile!r}"
    guardrails = input_guardrails_of(given, owner)
    if beside := [g.name for g in guardrails if g.run_in_parallel]:
        raise ConfigurationError(
            f"{owner}: input guardrails {beside} run_in_parallel, which a Pydantic AI run"
            " cannot honour (it journals its first model response before they could discard"
            " it); give them run_in_parallel=False",
            profile=profile,
            option="input_guardrails",
        )
    return guardrails


def profile_of(value: Any) -> DurableAgent | None:
    """The profile of a named Pydantic AI agent found in an agents module (the worker finds
    this function through the ``convoq.profiles`` entry point)."""
    if isinstance(value, PydanticAgent) and value.name:
        return DurableAgent(value)
    return None


def _jsonable(output: Any) -> Any:
    return to_jsonable_python(output)

"""The in-process Agent: conversation memory around the one turn engine.

An Agent loads the stored history window before each prompt, runs
:class:`convoq.engine.TurnLoop`, and only after the turn succeeds appends the whole turn
(user message, assistant replies, tool calls and results). A turn that pauses for approval
keeps its conversation reserved until it is resumed, discarded or its approval ttl passes.

The Agent takes no lock of its own: it asks its memory to reserve the conversation, park
it, commit the turn and release it (:meth:`ConversationMemory.areserve` and friends). So
each backend decides what "one writer" spans: one memory object in process, every
process and worker on a Redis store (the conversation's lease and a fenced commit).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any, Literal

from convoq import _agent_profile
from convoq._agent_continuations import AgentInput as AgentInput
from convoq._agent_continuations import decide
from convoq._agent_options import DEFAULT_BUSY_TIMEOUT_S as DEFAULT_BUSY_TIMEOUT_S
from convoq._agent_options import Limits, asked, check_options, resumed_shape, tool_names
from convoq._agent_turns import AgentTurns
from convoq._sync import iterate_sync, run_sync
from convoq.agent_response import Continuation, Response, parse_continuation
from convoq.approvals import ApprovalRule, check_rule
from convoq.compaction import CompactionPolicy
from convoq.context import DepsHolder, Instructions, check_metadata
from convoq.engine import DEFAULT_MAX_STEPS, Outcome, ignore_event
from convoq.guardrails import input_guardrails_of, output_guardrails_of
from convoq.handoffs import check_name, handoff_tools
from convoq.ids import check_conversation_id
from convoq.mcp.config import MCPServer, check_servers
from convoq.memory.adapt import MemoryLike, as_memory
from convoq.memory.base import ConversationMemory
from convoq.model_settings import ModelSettings, SettingsLike, check_tool_choice, coerce_settings
from convoq.models.base import Model
from convoq.output import DEFAULT_OUTPUT_RETRIES, OutputShape, OutputType, output_shape
from convoq.profile import TurnJob
from convoq.subagents import subagent_tool, subagent_tools
from convoq.tokens import TokenCounter
from convoq.tools import Tool, ToolRegistry
from convoq.turn_state import TurnEvent
from convoq.window import check_budget


class Agent:
    """An LLM agent with optional conversation memory.

    Args:
        model: any :class:`convoq.models.Model` (``openai(...)``, ``ScriptedModel(...)``).
        instructions: sent as a leading system message on every call (never stored); a
            str, or a function of the :class:`~convoq.context.RunContext` (sync or async)
            returning one, called before each model call.
        memory: where conversations live; without it nothing is loaded or stored.
        conversation_id: the default conversation for calls that name none.
        tools: ``@tool`` functions (plain functions are wrapped).
        keep_last_turns: previous turns sent with each prompt; 0 sends all of them.
        max_history_tokens: send only the leading system/developer messages plus the
            newest whole turns that fit this many tokens (None: no budget); see
            :class:`convoq.window.Window`. Works with ``keep_last_turns``.
        token_counter: counts tokens for ``max_history_tokens`` (None: the recorded
            usage of each turn where there is one, else an offline estimate).
        name: the profile name workers know this agent by.
        max_steps: model calls allowed per turn.
        fail_on_length: a model answer cut off at its token limit (``finish_reason ==
            "length"``) fails the turn with TruncatedAnswerError and stores nothing;
            by default it is kept and ``Response.finish_reason`` says ``"length"``.
        if_busy: a conversation with a turn running or awaiting approval (here, in
            another process or in a worker, as far as the memory reaches) makes a call
            raise ConversationBusyError (``"reject"``) or wait for it (``"wait"``).
        busy_timeout_s: the longest ``"wait"`` before ConversationBusyError.
        compaction: summarise the oldest turns once the unsummarised part of a conversation
            passes the policy's threshold (after a turn is stored; in process here, as a
            ``convoq.compact`` task on workers); turns then send the leading messages,
            the summary and the turns after it.
        approval_ttl_s: how long a turn awaiting approval keeps its conversation; after
            that its continuation is refused (None: ``defaults.APPROVAL_TTL_S`` in
            process, the workers' ``CONVOQ_APPROVAL_TTL_S`` for a worker profile).
        output_type: the shape of the final answer (a pydantic model, a dataclass or an
            object JSON schema; see :mod:`convoq.output`): the model is asked for it, the
            answer is validated and ``Response.output`` holds it typed. None: free text.
        output_retries: answers that do not fit ``output_type`` sent back to the model
            with the errors before OutputValidationError.
        model_settings: :class:`ModelSettings` (or a dict of its fields) sent with every
            model request; a call's own are merged over them.
        deps: application objects every tool and instructions function reads as
            ``ctx.deps`` (never serialised).
        deps_factory: instead of ``deps``, a function (no arguments) that makes them; it
            is called once per process, at the first turn there (each worker process
            makes its own database pool, say).
        approval_policy: ``(ctx, arguments) -> bool`` (sync or async) over every tool:
            a call waits for approval when it or the tool's ``requires_approval`` says so.
        mcp_servers: MCP servers whose tools are offered too, named ``<server>__<tool>``
            (:func:`convoq.mcp.stdio_server`, :func:`convoq.mcp.http_server`; needs
            ``convoq[mcp]``).
        input_guardrails: checks of the user message before the first model call
            (functions ``(ctx, message) -> GuardrailResult``, agents, or
            :func:`~convoq.guardrails.input_guardrail` ones; see :mod:`convoq.guardrails`).
        output_guardrails: checks of the final answer (typed output, else text) before
            the turn is stored. A tripped guardrail ends the turn as blocked, storing
            nothing: GuardrailTripped names it and says why.
        subagents: agents (named) offered to the model as tools, each taking an
            ``input`` to ask; on workers also profile names. A call runs the sub-agent as
            a child turn (:mod:`convoq.subagents`); :meth:`as_tool` names one otherwise.
        handoffs: agents (named) the model may hand the conversation to, each offered as
            a ``transfer_to_<name>`` tool; on workers also profile names. The rest of the
            turn runs as that agent (:mod:`convoq.handoffs`); the agent needs a name.
    """

    def __init__(
        self,
        model: Model,
        instructions: Instructions | None = None,
        *,
        memory: ConversationMemory | MemoryLike | None = None,
        conversation_id: str | None = None,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        keep_last_turns: int = 0,
        max_history_tokens: int | None = None,
        token_counter: TokenCounter | None = None,
        name: str | None = None,
        max_steps: int = DEFAULT_MAX_STEPS,
        fail_on_length: bool = False,
        if_busy: Literal["reject", "wait"] = "reject",
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        approval_ttl_s: float | None = None,
        compaction: CompactionPolicy | None = None,
        output_type: OutputType | None = None,
        output_retries: int = DEFAULT_OUTPUT_RETRIES,
        model_settings: SettingsLike | None = None,
        deps: Any = None,
        deps_factory: Callable[[], Any] | None = None,
        approval_policy: ApprovalRule = False,
        mcp_servers: Iterable[MCPServer] = (),
        input_guardrails: Iterable[Any] = (),
        output_guardrails: Iterable[Any] = (),
        subagents: Iterable[Any] = (),
        handoffs: Iterable[Any] = (),
    ) -> None:
        check_options(
            if_busy=if_busy, busy_timeout_s=busy_timeout_s, approval_ttl_s=approval_ttl_s,
            keep_last_turns=keep_last_turns, max_steps=max_steps, output_retries=output_retries,
        )  # fmt: skip
        self.model = model
        self.instructions = instructions
        self.memory = as_memory(memory) if memory is not None else None
        self.conversation_id = (
            check_conversation_id(conversation_id) if conversation_id is not None else None
        )
        self.mcp_servers = check_servers(mcp_servers)
        handing = handoff_tools(handoffs)
        if handing:
            check_name(name, "an Agent with handoffs, named")
        self.tools = ToolRegistry(
            [*tools, *subagent_tools(subagents), *handing], toolsets=self.mcp_servers
        )
        self.output = output_shape(output_type)
        self.output_retries = output_retries
        self.model_settings = coerce_settings(model_settings)
        check_tool_choice(self.model_settings, tool_names(self))
        self.keep_last_turns = keep_last_turns
        self.max_history_tokens = check_budget(max_history_tokens)
        self.token_counter = token_counter
        self.name = name
        self.max_steps = max_steps
        self.fail_on_length = fail_on_length
        self.compaction = compaction
        self.if_busy = if_busy
        self.busy_timeout_s = busy_timeout_s
        # None: the default of where the turn parks (in process, or the worker's setting).
        self.approval_ttl_s = approval_ttl_s
        self.approval_policy = check_rule(approval_policy, "approval_policy")
        self._deps = DepsHolder(deps, deps_factory)
        owner = f"Agent {name!r}" if name else "Agent"
        self.input_guardrails = input_guardrails_of(input_guardrails, owner)
        self.output_guardrails = output_guardrails_of(output_guardrails, owner)

    def as_tool(self, *, name: str | None = None, description: str | None = None) -> Tool:
        """This agent as a sub-agent tool of another (``tools=[...]`` or
        ``subagents=[...]``): named ``name`` (default: the agent's name), described to the
        model by ``description``; a call runs it as a child turn (:mod:`convoq.subagents`).

        Raises:
            ConfigurationError: the agent has no name (its child turns run on the worker
                profile of that name).
        """
        return subagent_tool(self, name=name, description=description)

    # -- the async core -------------------------------------------------------------------
    async def agenerate(
        self,
        input: AgentInput,
        *,
        conversation_id: str | None = None,
        keep_last_turns: int | None = None,
        max_history_tokens: int | None = None,
        output_type: OutputType | None = None,
        model_settings: SettingsLike | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Response:
        """Run one turn and return its response (see :class:`Response`); ``keep_last_turns``,
        ``max_history_tokens`` and ``output_type`` override the agent's for this call,
        ``model_settings`` are merged over the agent's; ``metadata`` (a JSON object) is
        what every tool of the turn sees as ``ctx.metadata``."""
        limits = Limits(keep_last_turns, max_history_tokens, check_metadata(metadata))
        call = asked(self, output_type, model_settings)
        return await AgentTurns(self).start(input, conversation_id, limits, ignore_event, call)

    async def astream(
        self,
        input: AgentInput,
        *,
        conversation_id: str | None = None,
        keep_last_turns: int | None = None,
        max_history_tokens: int | None = None,
        output_type: OutputType | None = None,
        model_settings: SettingsLike | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> AsyncIterator[TurnEvent]:
        """Run one turn, yielding its events; the last one is ``done`` with the status
        (and ``output``, the validated answer as JSON, with an output type). Arguments
        as :meth:`agenerate`."""
        call = asked(self, output_type, model_settings)
        limits = Limits(keep_last_turns, max_history_tokens, check_metadata(metadata))
        queue: asyncio.Queue[TurnEvent | None] = asyncio.Queue()

        async def emit(event: TurnEvent) -> None:
            await queue.put(event)

        async def run() -> Response:
            try:
                return await AgentTurns(self).start(input, conversation_id, limits, emit, call)
            finally:
                await queue.put(None)

        task = asyncio.create_task(run())
        try:
            while (event := await queue.get()) is not None:
                yield event
            response = await task
        finally:
            if not task.done():
                # Left early: stop the turn and wait until it has released its conversation.
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        done: dict[str, Any] = {"status": response.status, "text": response.text}
        done |= {"usage": response.usage.model_dump(), "finish_reason": response.finish_reason}
        if response.output_data is not None:
            done["output"] = response.output_data
        yield TurnEvent(type="done", data=done)

    async def aresume(
        self,
        continuation: Continuation | dict[str, Any] | str,
        decisions: dict[str, Any],
        *,
        output_type: OutputType | None = None,
        by: str | None = None,
    ) -> Response:
        """Go on with a paused turn: ``{call_id: True}`` approves, ``False`` (or a
        :class:`Decision` with a reason) denies; ``by`` names who decided (kept with the
        stored tool results, with the time). The completed turn is stored once. The
        turn keeps the output spec and settings it started with; ``output_type`` gives
        its output back typed (else the agent's type when the spec is the agent's, else
        JSON)."""
        cont = parse_continuation(continuation)
        shape = resumed_shape(self, cont, output_shape(output_type))
        decide(cont, decisions, by)
        return await AgentTurns(self).run(cont, ignore_event, shape, resume=True)

    async def adiscard(self, continuation: Continuation | dict[str, Any] | str) -> None:
        """Drop a paused turn: nothing is stored and the conversation is free again."""
        await AgentTurns(self).discard(parse_continuation(continuation))

    # -- sync wrappers ---------------------------------------------------------------------
    def generate(
        self,
        input: AgentInput,
        *,
        conversation_id: str | None = None,
        keep_last_turns: int | None = None,
        max_history_tokens: int | None = None,
        output_type: OutputType | None = None,
        model_settings: SettingsLike | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Response:
        """Blocking :meth:`agenerate`."""
        return run_sync(
            self.agenerate(
                input,
                conversation_id=conversation_id,
                keep_last_turns=keep_last_turns,
                max_history_tokens=max_history_tokens,
                output_type=output_type,
                model_settings=model_settings,
                metadata=metadata,
            )
        )

    def stream(
        self,
        input: AgentInput,
        *,
        conversation_id: str | None = None,
        keep_last_turns: int | None = None,
        max_history_tokens: int | None = None,
        output_type: OutputType | None = None,
        model_settings: SettingsLike | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Iterator[TurnEvent]:
        """Blocking :meth:`astream`."""
        return iterate_sync(
            self.astream(
                input,
                conversation_id=conversation_id,
                keep_last_turns=keep_last_turns,
                max_history_tokens=max_history_tokens,
                output_type=output_type,
                model_settings=model_settings,
                metadata=metadata,
            )
        )

    def resume(
        self,
        continuation: Continuation | dict[str, Any] | str,
        decisions: dict[str, Any],
        *,
        output_type: OutputType | None = None,
        by: str | None = None,
    ) -> Response:
        """Blocking :meth:`aresume`."""
        return run_sync(self.aresume(continuation, decisions, output_type=output_type, by=by))

    def discard(self, continuation: Continuation | dict[str, Any] | str) -> None:
        """Blocking :meth:`adiscard`."""
        run_sync(self.adiscard(continuation))

    # -- the worker profile (convoq.profile.AgentProfile) ----------------------------------
    async def run_turn(self, job: TurnJob) -> Outcome:
        """Run a worker's turn (the :class:`~convoq.profile.AgentProfile` interface)."""
        return await _agent_profile.run_turn(self, job)

    def asked_of(self, options: dict[str, Any]) -> tuple[ModelSettings | None, OutputShape | None]:
        """What a queued turn asks of the model: the settings (the agent's, the turn's
        merged over them) and the output shape (the turn's, else the agent's). The turn's
        options are checked again: they are data from outside this process.

        Raises:
            InvalidModelSettingsError: a setting is invalid; the turn fails with it.
            InvalidOutputTypeError: the output schema is unusable; the turn fails with it.
        """
        return _agent_profile.asked_of(self, options)

    async def provided_deps(self) -> Any:
        """``deps``, or what ``deps_factory`` made in this process (made at first use)."""
        return await self._deps.get()

    def worker_refusals(self) -> dict[str, str]:
        """The options set on this agent that workers cannot honour, each with what to do
        instead (the :class:`~convoq.profile.AgentProfile` interface: a worker refuses to
        start with such a profile). Every other option is honoured on workers."""
        return _agent_profile.worker_refusals(self)

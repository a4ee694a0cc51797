"""THE turn loop, shared by the in-process Agent and the workers.

:class:`TurnLoop` takes the history window and the turn so far (a :class:`TurnState`) and
drives model calls and tool calls until the model answers without tool calls
(``Completed``), a tool needs approval (``Paused``), the model handed the turn to another
agent (``HandedOff``: its caller goes on with that agent's loop, :mod:`convoq.handoffs`), or
the calls whose approval expired got their answers (``Expired``: no further model call). Guardrails
(:mod:`convoq.guardrails`) check the user message before the first model call and the
final answer before it is returned; a tripped one raises GuardrailTripped (the turn is
blocked). Each tool call, each instructions function and each approval policy sees a
:class:`~convoq.context.RunContext` made from the loop's ``scope``. Any error raised ends
the turn as failed; the caller stores nothing then. The state after every step is handed
to ``checkpoint`` so a worker can journal it, and running again from a journaled state
repeats no finished step: the loop derives what is left to do from the messages alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from convoq import defaults
from convoq._sync import call_maybe_async
from convoq.approvals import ApprovalRule, refused_result, rule_says
from convoq.context import Instructions, RunContext, TurnScope
from convoq.errors import (
    ConvoqError,
    MaxStepsExceededError,
    ToolError,
    ToolFailure,
    TruncatedAnswerError,
    TurnCancelledError,
)
from convoq.guardrails import InputGuardrail, OutputGuardrail, beside, check_all
from convoq.handoffs import answers, current_agent, followed, handoffs_of
from convoq.messages import MAX_MODEL_NAME, Message, MessageRole, ToolCall
from convoq.model_settings import ModelSettings
from convoq.models.base import Model, ModelRequest
from convoq.observe import metrics, tracing
from convoq.output import DEFAULT_OUTPUT_RETRIES, OutputShape, TypedOutput, instructions_for
from convoq.subagents import Children, InlineChildren, SubAgentTool, call_data, known_results
from convoq.tools import Tool, ToolOutput, ToolRegistry
from convoq.turn_state import Decision, TurnEvent, TurnState, Wait
from convoq.usage import Usage, turn_usage
from convoq.waits import WaitRequest, supplied_text, wait_data

DEFAULT_MAX_STEPS = 10
# Failing tool calls are logged here (with the ids as record attributes, see
# _report_tool_error), not under convoq.engine: operators filter tools on their own.
tool_log = logging.getLogger("convoq.tools")


@dataclass
class Completed:
    """The model answered: ``messages`` is the whole turn, user message first; ``steps``
    the model calls it took; ``output``: the answer as JSON, when the agent has a typed
    output (an integrated framework's agent; None otherwise)."""

    messages: list[Message]
    steps: int = 0
    output: TypedOutput | None = None  # the validated answer, when the turn has an output type

    @property
    def text(self) -> str:
        return self.messages[-1].text

    @property
    def usage(self) -> Usage:
        """Tokens the turn's model calls reported, summed."""
        return turn_usage(self.messages[1:], requests=self.steps)

    @property
    def finish_reason(self) -> str | None:
        """Why the final model call stopped (``"length"``: the answer is cut off)."""
        return self.messages[-1].finish_reason

    @property
    def refusal(self) -> str | None:
        """The model's refusal, when it refused instead of answering."""
        return self.messages[-1].refusal


@dataclass
class Paused:
    """Tool calls wait for approval; ``state`` carries everything needed to go on."""

    state: TurnState

    @property
    def pending(self) -> list[ToolCall]:
        return self.state.undecided


@dataclass
class Expired(Completed):
    """The approval of some tool calls expired: ``messages`` end with their tool results,
    which say so; the turn ends without another model call (and is stored)."""

    @property
    def text(self) -> str:
        return ""


@dataclass
class HandedOff:
    """The model handed the turn to ``target`` (:mod:`convoq.handoffs`): ``state`` (its
    last step the handoff's tool result) goes on as that agent."""

    state: TurnState
    target: str


Outcome = Completed | Paused | HandedOff
EventSink = Callable[[TurnEvent], Awaitable[None]]
# What a sink may offer beside: ``sink.text(text)``, a ``text_delta`` event's text alone.
TextSink = Callable[[str], Awaitable[None]]
Checkpoint = Callable[[TurnState], Awaitable[None]]
StopCheck = Callable[[], Awaitable[bool]]


class StreamedText:
    """Where a model call streams its text: each delta to the turn's events, and
    :meth:`retract` when the model retries the call after some of its text went out (a
    stream dropped part way): a ``text_retracted`` event tells readers that the text of
    this call so far is void, and it streams again from its start."""

    def __init__(self, emit: EventSink) -> None:
        self._emit = emit
        # A sink that takes streamed text as it is (a worker's, which coalesces it) saves
        # an event object per delta: a reply streams in dozens of them.
        self._text: TextSink | None = getattr(emit, "text", None)
        self._retractions = 0

    async def __call__(self, text: str) -> None:
        if self._text is not None:
            await self._text(text)
        else:
            await self._emit(TurnEvent(type="text_delta", data={"text": text}))

    async def retract(self) -> None:
        self._retractions += 1
        data = {"reason": "model_retry", "retry": self._retractions}
        await self._emit(TurnEvent(type="text_retracted", data=data))


async def ignore_event(_event: TurnEvent) -> None:
    """The event sink of a turn nobody follows."""
    return None


async def _no_checkpoint(_state: TurnState) -> None:
    return None


async def _never_stop() -> bool:
    return False


@dataclass
class TurnLoop:
    """Everything a turn needs besides its state. One object per turn run.
    ``fail_on_length``: a model answer cut off at its token limit fails the turn
    (TruncatedAnswerError) instead of being kept with ``finish_reason == "length"``.
    ``settings`` go with every model request; with ``output`` the final answer is
    validated (:mod:`convoq.output`), retried ``output_retries`` times with the errors.
    ``scope``: the turn's identity, metadata and deps, from which each tool call (and
    instructions given as a function) gets its :class:`~convoq.context.RunContext`.
    ``approval_policy``: the agent's rule over every tool, besides each tool's own."""

    model: Model
    tools: ToolRegistry
    history: list[Message]
    instructions: Instructions | None = None
    max_steps: int = DEFAULT_MAX_STEPS
    fail_on_length: bool = False
    emit: EventSink = ignore_event
    checkpoint: Checkpoint = _no_checkpoint
    should_stop: StopCheck = _never_stop
    settings: ModelSettings | None = None
    output: OutputShape | None = None
    output_retries: int = DEFAULT_OUTPUT_RETRIES
    scope: TurnScope = field(default_factory=lambda: TurnScope(None, ""))
    approval_policy: ApprovalRule = False
    # Checks of the user message before the first model call, and of the final answer
    # (:mod:`convoq.guardrails`): a tripped one raises GuardrailTripped.
    input_guardrails: tuple[InputGuardrail, ...] = ()
    output_guardrails: tuple[OutputGuardrail, ...] = ()
    # How sub-agent calls run (:mod:`convoq.subagents`): in process here, or parked as
    # child turns on workers.
    children: Children = field(default_factory=InlineChildren)
    # Handoffs one turn may make (:mod:`convoq.handoffs`); past it one is refused.
    max_handoffs: int = defaults.MAX_HANDOFFS
    # The turn was handed to this agent before it started (a conversation's later turn):
    # its assistant messages carry its name, as in a turn that hands off.
    handed: bool = False
    _specs: list[Any] = field(default_factory=list, init=False)

    async def run(self, state: TurnState) -> Outcome:
        # MCP servers' tools as they are listed now, the same for the whole run.
        self.tools = await self.tools.for_turn()
        self._specs = self.tools.specs()
        while True:
            if await self.should_stop():
                raise TurnCancelledError("the turn was cancelled")
            last = state.messages[-1]
            open_calls = _unanswered_calls(state.messages)
            if (target := self._handed_to(state, open_calls)) is not None:
                return HandedOff(state, target)
            if open_calls:
                if not await self._run_calls(state, open_calls):
                    return Paused(state)
            elif state.expired:
                return Expired(list(state.messages), state.steps)
            elif last.role == MessageRole.ASSISTANT and state.steps > 0:
                # An assistant message the turn did not produce (the end of a
                # GenerationRequest) is input: the model still has to answer.
                if (completed := await self._final(state)) is not None:
                    return completed
            else:
                await self._call_model(state)

    async def _call_model(self, state: TurnState) -> None:
        if state.steps >= self.max_steps:
            raise MaxStepsExceededError(
                f"the model asked for tools {state.steps} times without a final answer;"
                " raise max_steps or check the tools",
                max_steps=self.max_steps,
            )
        instructions = instructions_for(await self._instructions(state), self.output, self.model)
        lead = [Message.system(instructions)] if instructions else []
        request = ModelRequest(
            messages=lead + self.history + state.messages, tools=self._specs,
            settings=self.settings, output=self.output.spec if self.output else None,
        )  # fmt: skip

        started = time.monotonic()
        reply = _named(
            await self._guarded_ask(state, request, StreamedText(self.emit)), self.model.name
        )
        latency_ms = round((time.monotonic() - started) * 1000)
        if self.fail_on_length and reply.finish_reason == "length":
            raise TruncatedAnswerError(
                "the model stopped at its token limit (finish_reason 'length'), its answer"
                " cut off; raise max_tokens (model_settings), shorten the input, or"
                " keep such answers with fail_on_length=False",
                finish_reason="length",
                usage=reply.usage.model_dump() if reply.usage else None,
            )
        state.steps += 1
        if (speaker := self._speaker(state)) is not None:
            reply = reply.model_copy(update={"name": speaker})
        state.messages.append(reply)
        await self.checkpoint(state)
        answered = _assistant_data(reply, self.model.name, latency_ms)
        await self.emit(TurnEvent(type="assistant", data=answered))

    async def _guarded_ask(
        self, state: TurnState, request: ModelRequest, on_delta: Callable[[str], Awaitable[None]]
    ) -> Message:
        """The model call; before the first one, the input guardrails check the user
        message (those that run in parallel beside it: its answer is kept only once they
        passed). The first answer is journaled only after that, so a rerun that finds it
        skips the guardrails that let it through."""
        if state.steps > 0 or not self.input_guardrails:
            return await self._ask(request, on_delta, state.steps + 1)
        ctx = self.scope.context(state.steps, _usage_so_far(state))
        first = [g for g in self.input_guardrails if not g.run_in_parallel]
        along = [g for g in self.input_guardrails if g.run_in_parallel]
        await check_all(first, ctx, state.messages[0], self.emit)
        asking = self._ask(request, on_delta, state.steps + 1)
        return await beside(asking, along, ctx, state.messages[0], self.emit)

    async def _final(self, state: TurnState) -> Completed | None:
        """The turn's end (its answer checked by the output guardrails), or None when an
        answer that does not fit the output type was answered with a retry prompt
        (journaled: a rerun goes on from there)."""
        if self.output is None:
            completed = Completed(list(state.messages), state.steps)
            await self._guard_output(state, completed.text)
            return completed
        verdict = self.output.judge(state.messages, self.output_retries)
        if isinstance(verdict, TypedOutput):
            await self._guard_output(state, verdict.value)
            return Completed(list(state.messages), state.steps, verdict)
        state.messages.append(verdict)
        await self.checkpoint(state)
        return None

    async def _guard_output(self, state: TurnState, value: Any) -> None:
        """The output guardrails on the final answer (raise GuardrailTripped)."""
        if self.output_guardrails:
            ctx = self.scope.context(state.steps, _usage_so_far(state))
            await check_all(self.output_guardrails, ctx, value, self.emit)

    async def _ask(
        self, request: ModelRequest, on_delta: Callable[[str], Awaitable[None]], step: int
    ) -> Message:
        """One model request, timed and traced (an error is recorded, then raised)."""
        name = self.model.name
        started = time.monotonic()
        with tracing.span("convoq.model", {"gen_ai.request.model": name, "convoq.step": step}):
            try:
                reply = await self.model.request(request, on_text_delta=on_delta)
            except Exception as exc:
                metrics.model_request(name, time.monotonic() - started, exc)
                raise
        metrics.model_request(name, time.monotonic() - started)
        if reply.usage is not None:
            metrics.tokens_used(name, _token_counts(reply.usage))
        return reply

    async def _instructions(self, state: TurnState) -> str | None:
        """The system prompt: as given, or what the instructions function returns now."""
        if self.instructions is None or isinstance(self.instructions, str):
            return self.instructions
        ctx = self.scope.context(state.steps, _usage_so_far(state))
        text = await call_maybe_async(self.instructions, ctx)
        if text is not None and not isinstance(text, str):
            raise ConvoqError(
                f"instructions function returned {type(text).__name__}, not str (or None)"
            )
        return text or None

    def _handed_to(self, state: TurnState, open_calls: list[ToolCall]) -> str | None:
        """The agent whose turn it is, when that is not this loop's agent: the one whose
        step's calls are still open (a step that handed off runs all its calls first),
        else the one the last handoff named."""
        if open_calls:
            # Only a turn that handed off has steps of another agent (a name on an input
            # message, say a GenerationRequest's, is no agent).
            asked = _last_assistant(state.messages) if any(followed(state.messages)) else None
            current = asked.name if asked is not None and asked.name else self.scope.agent
        else:
            current = current_agent(state.messages, self.scope.agent)
        return current if current != self.scope.agent else None

    def _speaker(self, state: TurnState) -> str | None:
        """The name an assistant reply carries: the agent's, in a turn with handoffs."""
        agent = self.scope.agent
        if agent and (self.handed or handoffs_of(self.tools) or any(followed(state.messages))):
            return agent
        return None

    def _context(self, state: TurnState, call: ToolCall) -> RunContext[Any]:
        return self.scope.for_call(state.steps, _usage_so_far(state), call.id, call.name)

    async def _run_calls(self, state: TurnState, calls: list[ToolCall]) -> bool:
        """Run what may run; return False when some calls still wait for a decision (a
        person's, a child turn's) or for the world (:mod:`convoq.waits`)."""
        waiting: list[ToolCall] = []
        waits: dict[str, Wait] = {}
        ready = await self._subagent_results(state, calls)
        made = len(list(followed(state.messages)))
        handing = answers(calls, handoffs_of(self.tools), made, self.max_handoffs)
        ready |= {i: ToolOutput(t, is_error=t.startswith("Error")) for i, t in handing.items()}
        for call in calls:
            decision = state.decisions.get(call.id)
            ctx = self._context(state, call)
            if decision is None and call.id not in ready and await self._waits(ctx, call):
                waiting.append(call)
                continue
            wait = state.waits.get(call.id) if decision is not None else None
            if decision is not None and decision.expired and wait is None:
                state.expired = True  # journaled with the result: a rerun ends the same way
            await self.emit(TurnEvent(type="tool_call", data=call.model_dump()))
            try:
                output = await self._output(call, decision, wait, ready, ctx)
            except WaitRequest as parked:
                waiting.append(call)
                waits[call.id] = parked.wait
                continue
            if wait is not None:
                decision = None  # no approval: what arrived is the result (and in the record)
            result = Message.tool_result(call, output.text, decision)
            result.content.extend(output.attachments)  # images an MCP tool returned
            state.messages.append(result)
            await self.checkpoint(state)
            await self.emit(
                TurnEvent(
                    type="tool_result",
                    data={"id": call.id, "name": call.name, "result": output.text},
                )
            )
            if (target := current_agent([result], None)) is not None:
                data = {"call_id": call.id, "from": self.scope.agent, "to": target}
                await self.emit(TurnEvent(type="handoff", data=data))
        # Decisions are spent once their calls are answered; what is left waits for one.
        state.pending, state.decisions, state.waits = waiting, {}, waits
        if waiting:
            await self.checkpoint(state)
            for call in waiting:
                await self.emit(self._waiting_event(call, waits.get(call.id)))
            return False
        return True

    async def _output(
        self,
        call: ToolCall,
        decision: Decision | None,
        wait: Wait | None,
        ready: dict[str, ToolOutput],
        ctx: RunContext[Any],
    ) -> ToolOutput:
        """The call's output: its child's answer, what the world supplied, or the tool's
        (which may raise WaitRequest: the call waits)."""
        attributes = {"gen_ai.tool.name": call.name, "gen_ai.tool.call.id": call.id}
        with tracing.span("convoq.tool", attributes):
            if call.id in ready:
                return ready[call.id]
            if wait is not None and decision is not None:
                text, is_error = supplied_text(wait, decision)
                return ToolOutput(text, is_error=is_error)
            return await self._result_for(call, decision, ctx)

    def _subagent(self, call: ToolCall) -> SubAgentTool | None:
        tool = self.tools.get(call.name) if call.name in self.tools else None
        return tool if isinstance(tool, SubAgentTool) else None

    async def _waits(self, ctx: RunContext[Any], call: ToolCall) -> bool:
        """The call waits: for a child turn (a sub-agent call, on workers) or a person."""
        if (tool := self._subagent(call)) is not None:
            return self.children.parks and tool.fits(call.arguments)
        return await self._needs_approval(ctx, call)

    async def _subagent_results(
        self, state: TurnState, calls: list[ToolCall]
    ) -> dict[str, ToolOutput]:
        """The results of this step's sub-agent calls known now (:func:`known_results`)."""
        subs = [
            (call, tool, self._context(state, call))
            for call in calls
            if (tool := self._subagent(call)) is not None
            and call.id not in state.decisions
            and tool.fits(call.arguments)
        ]
        return await known_results(self.children, subs)

    def _waiting_event(self, call: ToolCall, wait: Wait | None) -> TurnEvent:
        """``deferred`` (what the call waits for), ``subagent_call`` (with the child turn
        it waits for) or ``approval_required``."""
        if wait is not None:
            return TurnEvent(type="deferred", data=wait_data(call, wait))
        tool = self._subagent(call)
        if tool is None:
            return TurnEvent(type="approval_required", data=call.model_dump())
        return TurnEvent(type="subagent_call", data=call_data(tool, call, self.scope))

    async def _needs_approval(self, ctx: RunContext[Any], call: ToolCall) -> bool:
        """The tool's rule or the agent's policy asks for a human. Unknown tools and
        arguments that do not fit the tool's schema run into their error instead: the
        model hears of it at once, and nobody is asked to approve a call that cannot run."""
        if call.name not in self.tools or not self.tools.get(call.name).fits(call.arguments):
            return False
        if await self.tools.get(call.name).needs_approval(ctx, call.arguments):
            return True
        return await rule_says(self.approval_policy, ctx, call.arguments, "approval_policy")

    async def _result_for(
        self, call: ToolCall, decision: Decision | None, ctx: RunContext[Any]
    ) -> ToolOutput:
        # A name the model made up is no label: labels must stay few.
        label = call.name if call.name in self.tools else "(unknown)"
        if decision is not None and (sub := self._subagent(call)) is not None:
            # Decided: its child turn ended (or the wait for it expired).
            metrics.tool_called(label, "ok")
            if decision.expired:
                return ToolOutput(f"Error: the sub-agent {sub.profile!r} did not finish"
                                  " before the turn's wait expired", is_error=True)  # fmt: skip
            return await self.children.run(sub, call, ctx)
        if decision is not None and not decision.approved:
            metrics.tool_called(label, "denied")
            return ToolOutput(refused_result(decision))
        tool: Tool | None = None
        try:
            tool = self.tools.get(call.name)
            output = await tool.output(call.arguments, ctx)
        except WaitRequest:
            raise  # the call waits for the world: the turn parks (counted once answered)
        except Exception as exc:  # a failing tool is news for the model, not a crash
            metrics.tool_called(label, "error")
            tracing.record_error(exc)
            text = await _tool_error_text(tool, exc, ctx)
            _report_tool_error(ctx, label, exc, text)
            return ToolOutput(text, is_error=True)
        metrics.tool_called(label, "error" if output.is_error else "ok")
        if output.is_error:  # an MCP server's isError answer: no exception, same report
            _report_tool_error(ctx, label, None, output.text)
        return output


async def _tool_error_text(tool: Tool | None, exc: Exception, ctx: RunContext[Any]) -> str:
    """What the model reads when a call raised ``exc``: a ToolFailure's message as it is;
    else the tool's ``error_text``, unless ``exc`` is convoq's ToolError about the call
    (unknown tool, invalid arguments: words the model can act on); else
    ``Error: <type>: <message>``. An ``error_text`` function that fails gets the default."""
    if isinstance(exc, ToolFailure):
        return exc.message
    default = f"Error: {type(exc).__name__}: {exc}"
    chosen = None if tool is None or isinstance(exc, ToolError) else tool.error_text
    if chosen is None or isinstance(chosen, str):
        return default if chosen is None else chosen
    try:
        text = await call_maybe_async(chosen, ctx, exc)
    except Exception:
        text = None
        tool_log.warning("error_text of tool %r raised", ctx.tool_name, exc_info=True)
    return text if isinstance(text, str) else default


def _report_tool_error(ctx: RunContext[Any], label: str, exc: Exception | None, text: str) -> None:
    """Count a failed call and log it with its ids, in the message and as record
    attributes; with the traceback unless the tool (ToolFailure) or convoq (ToolError)
    already said what went wrong. ``exc`` None: the tool reported an error (MCP isError)."""
    metrics.tool_failed(ctx.agent or "", label)
    ids = {
        "agent": ctx.agent,
        "conversation_id": ctx.conversation_id,
        "turn_id": ctx.turn_id,
        "tool_name": ctx.tool_name,
        "tool_call_id": ctx.tool_call_id,
    }
    what = "reported an error" if exc is None else f"raised {type(exc).__name__}: {exc}"
    explained = exc is None or isinstance(exc, ToolFailure | ToolError)
    tool_log.warning(
        "tool %r %s (conversation %r, turn %s, call %s); the model reads: %s",
        ctx.tool_name, what, ctx.conversation_id, ctx.turn_id, ctx.tool_call_id,
        text if len(text) <= 500 else text[:500] + "...",
        exc_info=None if explained else exc, extra=ids,
    )  # fmt: skip


def _usage_so_far(state: TurnState) -> Usage:
    return turn_usage(state.messages[1:], requests=state.steps)


def _token_counts(usage: Usage) -> dict[str, int]:
    """The kinds of tokens the metrics count (cached and reasoning are parts of input and
    output, as the API reports them)."""
    return {
        "input": usage.prompt_tokens,
        "output": usage.completion_tokens,
        "cached": usage.cached_tokens,
        "reasoning": usage.reasoning_tokens,
    }


def _named(reply: Message, model: str) -> Message:
    """The reply with the name of the model that gave it (stored with it: per-model usage
    and what a price table prices), unless the model named itself."""
    if reply.model is not None:
        return reply
    return reply.model_copy(update={"model": model[:MAX_MODEL_NAME]})


def _assistant_data(reply: Message, model: str, latency_ms: int) -> dict[str, Any]:
    """The ``assistant`` event: its text, what the model reported about the call, which
    model answered and how long the call took (ms)."""
    data: dict[str, Any] = {"text": reply.text, "model": model, "latency_ms": latency_ms}
    if reply.refusal is not None:
        data["refusal"] = reply.refusal
    if reply.finish_reason is not None:
        data["finish_reason"] = reply.finish_reason
    if reply.usage is not None:
        data["usage"] = reply.usage.model_dump()
    return data


def _last_assistant(messages: list[Message]) -> Message | None:
    return next((m for m in reversed(messages) if m.role == MessageRole.ASSISTANT), None)


def _unanswered_calls(messages: list[Message]) -> list[ToolCall]:
    """Tool calls of the last assistant message that have no tool result yet."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == MessageRole.ASSISTANT:
            answered = {m.tool_call_id for m in messages[index + 1 :]}
            return [c for c in message.tool_calls if c.id not in answered]
    return []

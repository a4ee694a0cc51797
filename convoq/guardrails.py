"""Guardrails: checks that may end a turn before its input reaches the model, or before
its answer is stored.

An *input* guardrail sees the turn's user message before the first model call; an
*output* guardrail sees the final answer (the typed output when the turn has an output
type, else the text) before the turn is stored. Each is a function ``(ctx, value) ->
GuardrailResult`` (sync or async; ``ctx`` is the turn's
:class:`~convoq.context.RunContext`), or an agent (anything with ``agenerate``, such as a
convoq :class:`~convoq.agent.Agent` without memory) asked for a :class:`GuardrailVerdict`.
A tripped guardrail ends the turn as ``blocked``: a ``guardrail_tripped`` event, then
:class:`~convoq.errors.GuardrailTripped` with its name and reason. A guardrail that
raises fails the turn with its own error: a check that could not run blocks nothing and
lets nothing through either.

An input guardrail with ``run_in_parallel=True`` runs beside the first model call
instead of before it; the model's answer is kept only once every such guardrail passed
(a tripped one discards it, and the text deltas already streamed belong to no turn).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, overload

from pydantic import BaseModel

from convoq._sync import call_maybe_async
from convoq.context import RunContext
from convoq.errors import ConvoqError, GuardrailTripped
from convoq.messages import Message
from convoq.observe import metrics
from convoq.turn_state import TurnEvent

MAX_REASON_CHARS = 1000
"""The longest reason kept (a longer one is cut, with ``...``)."""
MAX_INFO_BYTES = 16 * 1024
"""The largest ``info`` kept, as compact JSON (a larger one is replaced by a note)."""

Kind = Literal["input", "output"]
T = TypeVar("T")


@dataclass(frozen=True)
class GuardrailResult:
    """What a guardrail says: ``tripped`` ends the turn, ``reason`` says why (shown to
    whoever waits for the turn), ``info`` is anything else worth keeping (JSON)."""

    tripped: bool = False
    reason: str = ""
    info: Any = None

    @classmethod
    def passed(cls, info: Any = None) -> GuardrailResult:
        """The check passed: the turn goes on."""
        return cls(False, "", info)

    @classmethod
    def trip(cls, reason: str, info: Any = None) -> GuardrailResult:
        """The check failed: the turn ends as blocked, saying ``reason``."""
        return cls(True, reason, info)


class GuardrailVerdict(BaseModel):
    """The output type an agent used as a guardrail is asked for."""

    tripped: bool
    reason: str = ""


class GuardrailAgent(Protocol):
    """An agent that judges a value (a convoq ``Agent`` is one)."""

    name: str | None

    async def agenerate(self, input: Any, *, output_type: Any = None) -> Any: ...


GuardrailFunction = Callable[[RunContext[Any], Any], GuardrailResult | Awaitable[GuardrailResult]]
"""``(ctx, value) -> GuardrailResult``, sync or async."""


@dataclass(frozen=True)
class InputGuardrail:
    """A check of the turn's user message (see the module)."""

    check: GuardrailFunction
    name: str
    run_in_parallel: bool = False
    kind: Kind = "input"


@dataclass(frozen=True)
class OutputGuardrail:
    """A check of the turn's final answer, typed output or text (see the module)."""

    check: GuardrailFunction
    name: str
    kind: Kind = "output"


Guardrail = InputGuardrail | OutputGuardrail


@overload
def input_guardrail(fn: GuardrailFunction, /) -> InputGuardrail: ...
@overload
def input_guardrail(
    *, name: str | None = None, run_in_parallel: bool = False
) -> Callable[[GuardrailFunction], InputGuardrail]: ...
def input_guardrail(
    fn: GuardrailFunction | None = None, /, *, name: str | None = None,
    run_in_parallel: bool = False,
) -> InputGuardrail | Callable[[GuardrailFunction], InputGuardrail]:  # fmt: skip
    """Make ``fn`` an input guardrail (``@input_guardrail`` or
    ``@input_guardrail(name=..., run_in_parallel=True)``); named ``fn.__name__`` by default."""

    def make(check: GuardrailFunction) -> InputGuardrail:
        return InputGuardrail(_checked_function(check), name or _name_of(check), run_in_parallel)

    return make(fn) if fn is not None else make


@overload
def output_guardrail(fn: GuardrailFunction, /) -> OutputGuardrail: ...
@overload
def output_guardrail(
    *, name: str | None = None
) -> Callable[[GuardrailFunction], OutputGuardrail]: ...
def output_guardrail(
    fn: GuardrailFunction | None = None, /, *, name: str | None = None
) -> OutputGuardrail | Callable[[GuardrailFunction], OutputGuardrail]:
    """Make ``fn`` an output guardrail (``@output_guardrail`` or
    ``@output_guardrail(name=...)``); named ``fn.__name__`` by default."""

    def make(check: GuardrailFunction) -> OutputGuardrail:
        return OutputGuardrail(_checked_function(check), name or _name_of(check))

    return make(fn) if fn is not None else make


def input_guardrails_of(given: Iterable[Any], owner: str) -> tuple[InputGuardrail, ...]:
    """An agent's ``input_guardrails``: guardrails as they are; functions and agents
    wrapped (named after them). Raises ConvoqError for anything else, or two of one name."""
    made = tuple(
        g if isinstance(g, InputGuardrail) else InputGuardrail(*_wrapped(g, owner, "input"))
        for g in _listed(given, owner, "input")
    )
    return _unique(made, owner, "input")


def output_guardrails_of(given: Iterable[Any], owner: str) -> tuple[OutputGuardrail, ...]:
    """An agent's ``output_guardrails``, as :func:`input_guardrails_of`."""
    made = tuple(
        g if isinstance(g, OutputGuardrail) else OutputGuardrail(*_wrapped(g, owner, "output"))
        for g in _listed(given, owner, "output")
    )
    return _unique(made, owner, "output")


def _listed(given: Iterable[Any], owner: str, kind: Kind) -> list[Any]:
    if isinstance(given, str | bytes) or not isinstance(given, Iterable):
        raise ConvoqError(f"{owner}: {kind}_guardrails must be a list, not {type(given).__name__}")
    items = list(given)
    other = InputGuardrail if kind == "output" else OutputGuardrail
    for item in items:
        if isinstance(item, other):
            raise ConvoqError(
                f"{owner}: {item.name!r} is an {item.kind} guardrail, given in {kind}_guardrails"
            )
    return items


def _unique(made: tuple[T, ...], owner: str, kind: Kind) -> tuple[T, ...]:
    names = [getattr(g, "name", "") for g in made]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ConvoqError(
            f"{owner}: {kind}_guardrails {twice} share a name; name each one"
            f" (@{kind}_guardrail(name=...)): a trip must say which one it was"
        )
    return made


def _wrapped(value: Any, owner: str, kind: Kind) -> tuple[GuardrailFunction, str]:
    """A function or an agent given in a guardrail list, as (check, name)."""
    if callable(getattr(value, "agenerate", None)):
        if getattr(value, "memory", None) is not None:
            raise ConvoqError(
                f"{owner}: an agent used as a {kind} guardrail runs without memory (each"
                " check is a fresh question); give it none"
            )
        return _AgentCheck(value).ask, str(getattr(value, "name", None) or "agent")
    if not callable(value):
        raise ConvoqError(
            f"{owner}: an {kind} guardrail is a function (ctx, value) -> GuardrailResult, an"
            f" agent or an {kind.capitalize()}Guardrail, not {type(value).__name__}"
        )
    return _checked_function(value), _name_of(value)


def _checked_function(check: Any) -> GuardrailFunction:
    if not callable(check):
        raise ConvoqError(f"a guardrail is a function (ctx, value), not {type(check).__name__}")
    return check  # type: ignore[no-any-return]


def _name_of(check: Any) -> str:
    return str(getattr(check, "__name__", None) or type(check).__name__)


@dataclass(frozen=True)
class _AgentCheck:
    """An agent as a guardrail: asked about the value for a :class:`GuardrailVerdict`."""

    agent: GuardrailAgent

    async def ask(self, ctx: RunContext[Any], value: Any) -> GuardrailResult:
        question: Any = value if isinstance(value, Message | str) else json.dumps(value)
        response = await self.agent.agenerate(question, output_type=GuardrailVerdict)
        verdict = response.output
        if not isinstance(verdict, GuardrailVerdict):
            raise ConvoqError(f"guardrail agent answered {verdict!r}, not a GuardrailVerdict")
        return GuardrailResult(verdict.tripped, verdict.reason)


EventSink = Callable[[TurnEvent], Awaitable[None]]


async def check_all(
    guardrails: Sequence[Guardrail], ctx: RunContext[Any], value: Any, emit: EventSink
) -> None:
    """Run ``guardrails`` on ``value`` together; when one trips (the first in their order,
    if several do), emit ``guardrail_tripped``, count it and raise GuardrailTripped. An
    error a guardrail raises is raised as it is once all have ended.

    Raises:
        GuardrailTripped: a guardrail tripped.
    """
    if not guardrails:
        return
    said = await asyncio.gather(*(_one(g, ctx, value) for g in guardrails))
    for guardrail, result in zip(guardrails, said, strict=True):
        if result.tripped:
            await _trip(guardrail, result, ctx, emit)


async def beside(
    work: Awaitable[T],
    guardrails: Sequence[Guardrail],
    ctx: RunContext[Any],
    value: Any,
    emit: EventSink,
) -> T:
    """``work`` (the first model call) run beside ``guardrails``: its result once they all
    passed; when one trips or raises, ``work`` is cancelled and its result discarded."""
    task = asyncio.ensure_future(work)
    try:
        await check_all(guardrails, ctx, value, emit)
    except BaseException:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    return await task


async def _one(guardrail: Guardrail, ctx: RunContext[Any], value: Any) -> GuardrailResult:
    result = await call_maybe_async(guardrail.check, ctx, value)
    if not isinstance(result, GuardrailResult):
        raise ConvoqError(
            f"{guardrail.kind} guardrail {guardrail.name!r} returned"
            f" {type(result).__name__}, not a GuardrailResult"
        )
    return result


async def _trip(
    guardrail: Guardrail, result: GuardrailResult, ctx: RunContext[Any], emit: EventSink
) -> None:
    reason = str(result.reason or "no reason given")
    if len(reason) > MAX_REASON_CHARS:
        reason = reason[:MAX_REASON_CHARS] + "..."
    info = _bounded_info(result.info)
    data = {"guardrail": guardrail.name, "kind": guardrail.kind, "reason": reason, "info": info}
    await emit(TurnEvent(type="guardrail_tripped", data=data))
    metrics.guardrail_tripped(ctx.agent or "", guardrail.name, guardrail.kind)
    raise GuardrailTripped(
        f"{guardrail.kind} guardrail {guardrail.name!r} tripped: {reason}",
        guardrail=guardrail.name, kind=guardrail.kind, reason=reason, info=info,
    )  # fmt: skip


def _bounded_info(info: Any) -> Any:
    """``info`` as JSON (what is not JSON as its str), or a note when it is too large."""
    text = json.dumps(info, default=str, separators=(",", ":"))
    if len(text.encode()) > MAX_INFO_BYTES:
        return {"omitted": f"info over {MAX_INFO_BYTES} bytes"}
    return json.loads(text)

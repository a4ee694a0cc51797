"""Sub-agents: agents an agent offers the model as tools.

``Agent(subagents=[...])`` takes agents (or, for workers, agent profile names); each is a
tool named after it (``Agent.as_tool(name=..., description=...)`` names it otherwise) that
takes one argument, ``input``: what to ask. A call of one is a *child turn*:

- on workers, a turn of the sub-agent's profile queued like any other, on a child
  conversation whose id is derived from the parent conversation, the parent turn and the
  call id (:func:`child_ids`; a rerun of the parent finds its children instead of making
  new ones). The parent parks holding no worker slot, exactly as for an approval: each
  child that ends decides its call, and once every call of the step is decided the parent
  resumes on any worker. Several calls in one model step fan out in parallel.
- in process, the sub-agent's own ``agenerate``, run for the call (the calls of one step
  together); nothing parks.

The child's answer is the call's tool result (a typed output as its JSON); a child that
failed, was cancelled or blocked gives the model a tool error saying so. Depth and
fan-out are bounded (``CONVOQ_SUBAGENT_MAX_DEPTH``, ``CONVOQ_SUBAGENT_MAX_FANOUT``): a
call past either limit is refused with a tool error naming it, so recursion stops.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, Field

from convoq.context import RunContext, TurnScope
from convoq.errors import ConfigurationError, ConvoqError, GuardrailTripped, TurnCancelledError
from convoq.ids import check_conversation_id
from convoq.messages import ToolCall
from convoq.settings import ConvoqSettings
from convoq.tools import Tool, ToolOutput, ToolRegistry
from convoq.usage import Usage

OPTION = "subagent"
"""The turn option that makes a turn a child: ``{"conversation_id", "turn_id", "call_id",
"depth"}`` of its parent call (depth 1: the child of a turn nobody called)."""

_MAX_ID_PART = 160
CHILD_MARK = "~sub~"
"""What every child conversation id holds (``<parent conversation>~sub~<hash>``)."""


class SubAgentInput(BaseModel):
    """What a sub-agent tool takes."""

    input: str = Field(description="What to ask the sub-agent: the whole task, self-contained.")


class Delegate(Protocol):
    """An agent that can run a call in process (a convoq ``Agent`` is one)."""

    name: str | None

    async def agenerate(
        self,
        input: Any,
        *,
        conversation_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Any: ...


class SubAgentTool(Tool):
    """A sub-agent offered as a tool: ``profile`` is the agent profile its child turns
    run on (workers); ``agent`` the agent itself, when given (in process)."""

    def __init__(
        self, profile: str, agent: Delegate | None, *, name: str | None, description: str | None
    ) -> None:
        async def call(input: str) -> str:  # the schema's shape; calls go through Children
            raise ConvoqError("a sub-agent call runs as a child turn, not as a function")

        call.__name__ = name or profile
        super().__init__(
            call, name=name or profile,
            description=description or f"Ask the {profile} agent; it answers the input.",
        )  # fmt: skip
        self.profile = profile
        self.agent = agent


def subagent_tool(value: Any, *, name: str | None = None, description: str | None = None) -> Tool:
    """``value`` as a sub-agent tool: an agent with a name, or a profile name.

    Raises:
        ConfigurationError: an agent without a name, or something else.
    """
    if isinstance(value, SubAgentTool):
        return value
    if isinstance(value, str):
        if not value:
            raise ConfigurationError("a sub-agent profile name must not be empty")
        return SubAgentTool(value, None, name=name, description=description)
    if callable(getattr(value, "agenerate", None)):
        profile = getattr(value, "name", None)
        if not profile:
            raise ConfigurationError(
                "a sub-agent needs a name (Agent(..., name='...')): its child turns run on"
                " the worker profile of that name"
            )
        return SubAgentTool(str(profile), value, name=name, description=description)
    raise ConfigurationError(
        f"subagents takes agents (with names), profile names or Agent.as_tool(...), not"
        f" {type(value).__name__}"
    )


def check_inline(tools: ToolRegistry) -> None:
    """Refuse an in-process turn of an agent whose sub-agents are only profile names.

    Raises:
        ConfigurationError: naming the option and the sub-agent's profile.
    """
    for spec in tools.specs():
        tool = tools.get(spec.name)
        if isinstance(tool, SubAgentTool) and tool.agent is None:
            raise ConfigurationError(
                f"sub-agent {tool.profile!r} is a worker profile name (subagents): only"
                " workers can run it; in process give the Agent itself",
                option="subagents",
                profile=tool.profile,
            )


def subagent_tools(values: Iterable[Any]) -> list[Tool]:
    """An agent's ``subagents`` as tools (see :func:`subagent_tool`)."""
    if isinstance(values, str | bytes):
        raise ConfigurationError("subagents must be a list of agents or profile names")
    return [subagent_tool(v) for v in values]


@dataclass(frozen=True)
class ChildRef:
    """Where a sub-agent call's child turn lives."""

    conversation_id: str
    turn_id: str


@dataclass(frozen=True)
class ChildTurn:
    """A sub-agent call's child turn as its finished parent records it: the call, the
    sub-agent's profile, the child's ids, how it ended and its usage (its own children's
    included)."""

    call_id: str
    agent: str
    conversation_id: str
    turn_id: str
    status: str
    usage: Usage

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> ChildTurn:
        """One entry of a turn result's ``"children"``."""

        def text(name: str) -> str:
            return str(data.get(name) or "")

        return cls(
            text("call_id"), text("agent"), text("conversation_id"), text("turn_id"),
            text("status"), Usage.model_validate(data.get("usage") or {}),
        )  # fmt: skip


@dataclass(frozen=True)
class ParentCall:
    """The sub-agent call a child turn answers: its parent's ids, the call id and the
    child's depth (1: the child of a turn nobody called)."""

    conversation_id: str
    turn_id: str
    call_id: str
    depth: int

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> ParentCall | None:
        """The parent call of a turn with ``options``, or None when nobody called it."""
        called = options.get(OPTION)
        if not isinstance(called, dict):
            return None
        depth = called.get("depth")
        return cls(
            str(called.get("conversation_id") or ""), str(called.get("turn_id") or ""),
            str(called.get("call_id") or ""), depth if isinstance(depth, int) else 1,
        )  # fmt: skip


def children_of_result(result: Mapping[str, Any] | None) -> list[ChildTurn]:
    """The child turns a finished turn's result lists (none for a turn without)."""
    raw = (result or {}).get("children")
    return (
        [ChildTurn.from_data(c) for c in raw if isinstance(c, dict)]
        if isinstance(raw, list)
        else []
    )


def child_ids(parent_conversation: str, parent_turn: str, call_id: str) -> ChildRef:
    """The child conversation and turn of a call: the same for every run of the parent
    turn (so a rerun finds them), different for every parent turn and call."""
    digest = hashlib.sha256(
        "\0".join((parent_conversation, parent_turn, call_id)).encode()
    ).hexdigest()
    cid = f"{parent_conversation[:_MAX_ID_PART]}{CHILD_MARK}{digest[:16]}"
    return ChildRef(check_conversation_id(cid), digest[:32])


def child_input(call: ToolCall) -> str:
    """The question of a sub-agent call (its arguments checked by its tool first)."""
    value = call.arguments.get("input")
    return value if isinstance(value, str) else json.dumps(call.arguments)


def result_of(
    agent: str, status: str, result: Mapping[str, Any] | None, error: Mapping[str, Any] | None
) -> ToolOutput:
    """The tool result of a finished child turn: its answer (typed output as JSON, text as
    it is), or a tool error saying how it ended."""
    data = result or {}
    if status in ("succeeded", "completed"):
        output = data.get("output")
        if output is None or isinstance(output, str):  # no type, or text (Pydantic AI's str)
            return ToolOutput(output if isinstance(output, str) else str(data.get("text") or ""))
        return ToolOutput(json.dumps(output))
    said = (error or {}).get("message") or "no answer"
    return ToolOutput(f"Error: the sub-agent {agent!r} {status}: {said}", is_error=True)


def limit_refusal(calls: int, depth: int, max_depth: int, max_fanout: int) -> str | None:
    """Why a sub-agent call is refused at ``depth`` (the child's) as one of ``calls`` in
    its step beyond the fan-out, or None."""
    if depth > max_depth:
        return (
            f"Error: sub-agent calls may nest {max_depth} deep (CONVOQ_SUBAGENT_MAX_DEPTH);"
            " this one would be deeper: answer without it"
        )
    if calls > max_fanout:
        return (
            f"Error: at most {max_fanout} sub-agent calls may run at once"
            " (CONVOQ_SUBAGENT_MAX_FANOUT); ask for fewer in one step"
        )
    return None


async def known_results(
    children: Children, subs: list[tuple[ToolCall, SubAgentTool, RunContext[Any]]]
) -> dict[str, ToolOutput]:
    """The results of one step's sub-agent calls (with their tools and contexts) known
    now, by call id: all refused past a limit; in process, the children run together; on
    workers, none (the turn parks for them)."""
    if not subs:
        return {}
    depth = children.depth + 1
    refused = limit_refusal(len(subs), depth, children.max_depth, children.max_fanout)
    if refused is not None:
        return {call.id: ToolOutput(refused, is_error=True) for call, _, _ in subs}
    if children.parks:
        return {}
    outputs = await asyncio.gather(*(children.run(tool, call, ctx) for call, tool, ctx in subs))
    return {call.id: output for (call, _, _), output in zip(subs, outputs, strict=True)}


def call_data(tool: SubAgentTool, call: ToolCall, scope: TurnScope) -> dict[str, Any]:
    """A ``subagent_call`` event's data: the call, its agent and its child turn."""
    child = child_ids(scope.conversation_id or "", scope.turn_id, call.id)
    data = {**call.model_dump(), "agent": tool.profile}
    return data | {"conversation_id": child.conversation_id, "turn_id": child.turn_id}


class Children(Protocol):
    """How a turn's sub-agent calls run: ``parks`` (workers: the turn waits for child
    turns) or not (in process: :meth:`run` answers at once); ``depth`` is the turn's own
    (0: nobody called it); the limits, as the settings say."""

    @property
    def parks(self) -> bool: ...

    @property
    def depth(self) -> int: ...

    @property
    def max_depth(self) -> int: ...

    @property
    def max_fanout(self) -> int: ...

    async def run(self, tool: SubAgentTool, call: ToolCall, ctx: RunContext[Any]) -> ToolOutput:
        """The tool result of ``call``: the finished child's answer or error."""
        ...


# In process, how deep the running turn is (child turns run inside their parent's task).
_depth: contextvars.ContextVar[int] = contextvars.ContextVar("convoq_subagent_depth", default=0)
# In process, the child turns the running turn made: one list per turn, shared by the
# tasks its step's calls run in (a task copies the context, the list is the same object).
_made: contextvars.ContextVar[list[ChildTurn] | None] = contextvars.ContextVar(
    "convoq_subagent_children", default=None
)


class ChildrenMade:
    """The child turns an in-process turn makes while it runs (``with ChildrenMade() as
    made:`` around the turn's loop; ``made.children`` after it), each with its usage: the
    parent's answer sums them, as a worker's result does."""

    def __init__(self) -> None:
        self.children: list[ChildTurn] = []
        self._token: contextvars.Token[list[ChildTurn] | None] | None = None

    def __enter__(self) -> ChildrenMade:
        self._token = _made.set(self.children)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _made.reset(self._token)

    @property
    def usage(self) -> Usage:
        """Their usage summed (each one's includes its own children's)."""
        total = Usage()
        for child in self.children:
            total = total + child.usage
        return total


def _made_child(
    tool: SubAgentTool, call: ToolCall, child: ChildRef, status: str, usage: Usage
) -> None:
    made = _made.get()
    if made is not None:
        made.append(ChildTurn(call.id, tool.profile, child.conversation_id, child.turn_id,
                              status, usage))  # fmt: skip


class InlineChildren:
    """Sub-agent calls in process: the sub-agent's own ``agenerate`` on the child
    conversation of the call (:func:`child_ids`: stored there when the sub-agent has a
    memory), one level deeper."""

    parks = False

    def __init__(self, max_depth: int | None = None, max_fanout: int | None = None) -> None:
        self._limits = (max_depth, max_fanout)

    @property
    def depth(self) -> int:
        return _depth.get()

    @property
    def max_depth(self) -> int:
        return self._limits[0] or ConvoqSettings().subagent_max_depth

    @property
    def max_fanout(self) -> int:
        return self._limits[1] or ConvoqSettings().subagent_max_fanout

    async def run(self, tool: SubAgentTool, call: ToolCall, ctx: RunContext[Any]) -> ToolOutput:
        if tool.agent is None:
            raise ConfigurationError(
                f"sub-agent {tool.profile!r} is a worker profile name: in process give the"
                " Agent itself (subagents=[agent])",
                option="subagents",
                profile=tool.profile,
            )
        child = child_ids(ctx.conversation_id or "", ctx.turn_id, call.id)
        token = _depth.set(_depth.get() + 1)
        try:
            response = await tool.agent.agenerate(
                child_input(call), conversation_id=child.conversation_id, metadata=ctx.metadata
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            status = "blocked" if isinstance(exc, GuardrailTripped) else "failed"
            status = "cancelled" if isinstance(exc, TurnCancelledError) else status
            _made_child(tool, call, child, status, Usage())
            return result_of(tool.profile, status, None, {"message": f"{exc}"})
        finally:
            _depth.reset(token)
        usage = getattr(response, "usage", None)
        _made_child(tool, call, child, "succeeded", usage if isinstance(usage, Usage) else Usage())
        data = getattr(response, "output_data", None)
        text = getattr(response, "text", "")
        return result_of(tool.profile, "succeeded", {"output": data, "text": text}, None)

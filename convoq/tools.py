"""``@tool``: a function the model may call, its JSON schema built from its signature.

A tool whose first parameter is annotated :class:`~convoq.context.RunContext` receives the
call's context there; that parameter is not part of the schema the model sees.

Tools may also come from a *toolset* (an MCP server, :mod:`convoq.mcp`): a registry asks
its toolsets for their tools at the start of each turn (:meth:`ToolRegistry.for_turn`).
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, get_origin, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from convoq._sync import call_maybe_async
from convoq.approvals import ApprovalRule, check_rule, rule_says
from convoq.context import RunContext
from convoq.errors import ToolError
from convoq.messages import FilePart, ImagePart
from convoq.models.base import ToolSpec

log = logging.getLogger("convoq.tools")


@dataclass
class ToolOutput:
    """What a tool call gives the model: its text, attachments kept with the tool result
    (images an MCP tool returned), and whether the tool reported an error."""

    text: str
    attachments: list[ImagePart | FilePart] = field(default_factory=list)
    is_error: bool = False


ErrorText = str | Callable[[RunContext[Any], Exception], str | Awaitable[str]]
"""What the model reads when a tool raises: a text, or a function (sync or async) of the
call's context and the exception that returns it."""


class Tool:
    """A callable tool: name, description, argument model and approval policy.

    ``requires_approval``: True, False, or a function ``(ctx, arguments) -> bool`` (sync
    or async) deciding per call; ``arguments`` is the dict the model sent.
    ``error_text``: what the model reads when the tool raises (:data:`ErrorText`; None:
    ``Error: <type>: <message>``). A :class:`~convoq.errors.ToolFailure`'s message, and
    convoq's own :class:`~convoq.errors.ToolError` about the call (invalid arguments),
    are read as they are.
    """

    # Tools built without __init__ (an MCP server's) have none.
    error_text: ErrorText | None = None

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        requires_approval: ApprovalRule = False,
        error_text: ErrorText | None = None,
    ) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        self.description = (description or inspect.getdoc(fn) or "").strip()
        self.requires_approval = check_rule(requires_approval, f"tool {self.name!r}")
        if error_text is not None and not (isinstance(error_text, str) or callable(error_text)):
            raise ToolError(
                f"tool {self.name!r}: error_text must be a str or a function"
                f" (ctx, exception) -> str, not {type(error_text).__name__}"
            )
        self.error_text = error_text
        self.takes_context = _takes_context(fn)
        self.arguments_model = _arguments_model(fn, self.name, skip=int(self.takes_context))

    @property
    def spec(self) -> ToolSpec:
        schema = self.arguments_model.model_json_schema()
        schema.pop("title", None)
        return ToolSpec(name=self.name, description=self.description, parameters=schema)

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Validated keyword arguments, or ToolError saying what is wrong."""
        try:
            parsed = self.arguments_model.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ToolError(f"invalid arguments for tool {self.name!r}: {problems}") from exc
        return {field: getattr(parsed, field) for field in type(parsed).model_fields}

    async def call(self, arguments: dict[str, Any], ctx: RunContext[Any] | None = None) -> str:
        """Run the tool (sync tools in a worker thread) and render its result as text.
        A tool that takes a context gets ``ctx`` first (ToolError when there is none)."""
        kwargs = self.validate(arguments)
        if not self.takes_context:
            return _render(await call_maybe_async(self.fn, **kwargs))
        if ctx is None:
            raise ToolError(f"tool {self.name!r} takes a RunContext; call it with one")
        return _render(await call_maybe_async(self.fn, ctx, **kwargs))

    async def output(self, arguments: dict[str, Any], ctx: RunContext[Any]) -> ToolOutput:
        """The call's result as the engine stores it (:meth:`call`'s text, for a Python
        tool; tools from other sources may add attachments)."""
        return ToolOutput(await self.call(arguments, ctx))

    async def needs_approval(self, ctx: RunContext[Any], arguments: dict[str, Any]) -> bool:
        """Whether this call waits for a human (the tool's ``requires_approval``)."""
        return await rule_says(self.requires_approval, ctx, arguments, f"tool {self.name!r}")

    def fits(self, arguments: dict[str, Any]) -> bool:
        """Whether :meth:`validate` accepts ``arguments`` (the check a call runs first,
        made before anyone is asked to approve the call)."""
        try:
            self.validate(arguments)
        except ToolError:
            return False
        return True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def _takes_context(fn: Callable[..., Any]) -> bool:
    """The first parameter is annotated ``RunContext`` (or ``RunContext[...]``)."""
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        return False
    hint = get_type_hints(fn).get(params[0].name)
    return hint is RunContext or get_origin(hint) is RunContext


def _arguments_model(fn: Callable[..., Any], name: str, skip: int = 0) -> type[BaseModel]:
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    for param in list(inspect.signature(fn).parameters.values())[skip:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolError(f"tool {name!r}: *args and **kwargs cannot be described to a model")
        annotation = hints.get(param.name, Any)
        if annotation is RunContext or get_origin(annotation) is RunContext:
            raise ToolError(f"tool {name!r}: a RunContext parameter must come first")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    config = ConfigDict(extra="forbid")
    return create_model(f"{name}_arguments", __config__=config, **fields)


def _render(result: Any) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, BaseModel):
        return result.model_dump_json()
    try:
        return json.dumps(result, default=str)
    except (TypeError, ValueError):
        return str(result)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: ApprovalRule = False,
    error_text: ErrorText | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: ApprovalRule = False,
    error_text: ErrorText | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a function a tool: ``@tool``, ``@tool(requires_approval=True)`` or
    ``@tool(requires_approval=lambda ctx, args: args["amount"] > 100)``;
    ``@tool(error_text=...)`` chooses what the model reads when it raises (see
    :class:`Tool`)."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(
            f,
            name=name,
            description=description,
            requires_approval=requires_approval,
            error_text=error_text,
        )

    return wrap(fn) if fn is not None else wrap


class Toolset(Protocol):
    """Tools that come from elsewhere and may change (an MCP server's)."""

    @property
    def name(self) -> str: ...

    async def toolset_tools(self) -> list[Tool]:
        """The tools offered now."""
        ...

    def stand_in(self, name: str) -> Tool | None:
        """A tool to answer a call of ``name`` that the toolset claims but does not list
        now (it could not be reached), or None when the name is not the toolset's."""
        ...


class ToolRegistry:
    """The tools an agent offers, by name, and the toolsets whose tools it adds per turn."""

    def __init__(
        self, tools: Iterable[Tool | Callable[..., Any]] = (), toolsets: Iterable[Toolset] = ()
    ) -> None:
        self._tools: dict[str, Tool] = {}
        self.toolsets = tuple(toolsets)
        for item in tools:
            t = item if isinstance(item, Tool) else Tool(item)
            if t.name in self._tools:
                raise ToolError(f"two tools are named {t.name!r}")
            self._tools[t.name] = t

    async def for_turn(self) -> ToolRegistry:
        """The tools for one turn: these, plus each toolset's as it lists them now (a
        toolset's tool named like another tool is left out, with a warning)."""
        if not self.toolsets:
            return self
        snapshot = ToolRegistry(self._tools.values(), self.toolsets)
        for toolset in self.toolsets:
            for t in await toolset.toolset_tools():
                if t.name in snapshot._tools:
                    log.warning(
                        "%s offers a tool named %r like another: left out", toolset.name, t.name
                    )
                    continue
                snapshot._tools[t.name] = t
        return snapshot

    def get(self, name: str) -> Tool:
        found = self._tools.get(name)
        if found is not None:
            return found
        for toolset in self.toolsets:
            stand_in = toolset.stand_in(name)
            if stand_in is not None:
                return stand_in
        raise ToolError(f"the model called unknown tool {name!r}")

    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

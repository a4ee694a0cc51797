"""``@tool``: a function the model may call, its JSON schema built from its signature."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable
from typing import Any, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from convoq._sync import call_maybe_async
from convoq.errors import ToolError
from convoq.models.base import ToolSpec


class Tool:
    """A callable tool: name, description, argument model and approval policy."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        requires_approval: bool = False,
    ) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        self.description = (description or inspect.getdoc(fn) or "").strip()
        self.requires_approval = requires_approval
        self.arguments_model = _arguments_model(fn, self.name)

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

    async def call(self, arguments: dict[str, Any]) -> str:
        """Run the tool (sync tools in a worker thread) and render its result as text."""
        result = await call_maybe_async(self.fn, **self.validate(arguments))
        return _render(result)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def _arguments_model(fn: Callable[..., Any], name: str) -> type[BaseModel]:
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolError(f"tool {name!r}: *args and **kwargs cannot be described to a model")
        annotation = hints.get(param.name, Any)
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
    *, name: str | None = None, description: str | None = None, requires_approval: bool = False
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a function a tool: ``@tool`` or ``@tool(requires_approval=True)``."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(f, name=name, description=description, requires_approval=requires_approval)

    return wrap(fn) if fn is not None else wrap


class ToolRegistry:
    """The tools an agent offers, by name."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            t = item if isinstance(item, Tool) else Tool(item)
            if t.name in self._tools:
                raise ToolError(f"two tools are named {t.name!r}")
            self._tools[t.name] = t

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise ToolError(f"the model called unknown tool {name!r}") from None

    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

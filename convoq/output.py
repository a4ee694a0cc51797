"""Typed outputs: the shape a turn's final answer must have, and the check of the answer.

An output type is a pydantic model, a dataclass, or a JSON schema of an object (a dict).
:func:`output_shape` turns it into an :class:`OutputShape`: the :class:`OutputSpec` sent
with every model request (``strict`` only where the schema meets strict mode's rules:
every object closed, every property required) and a validator. A pydantic model or a
dataclass is validated by pydantic and comes back typed; a JSON schema is checked by
:mod:`convoq._json_schema` and comes back as plain JSON.

A model that declares ``structured_output = True`` is trusted to send the spec to its
API; any other model gets the schema in its instructions (:func:`instructions_for`). An
answer that does not fit is answered with a retry prompt naming the errors
(:meth:`OutputShape.judge`) until ``output_retries`` are spent; then
:class:`OutputValidationError` carries the last answer.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from convoq import _json_schema
from convoq.errors import InvalidOutputTypeError, OutputValidationError
from convoq.messages import Message, MessageRole
from convoq.models.base import OutputSpec

OutputType = type[Any] | dict[str, Any]
"""A pydantic model class, a dataclass, or the JSON schema of an object."""

DEFAULT_OUTPUT_RETRIES = 1
MAX_OUTPUT_SCHEMA_BYTES = 64 * 1024
_MAX_ERRORS = 20
_MAX_ERROR_CHARS = 300
# The last answer an OutputValidationError carries travels in the turn's record: bounded.
MAX_ANSWER_CHARS = 64 * 1024
_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n(.*)\n```$", re.DOTALL)


@dataclass(frozen=True)
class TypedOutput:
    """A validated answer: ``value`` as the output type gives it (a model instance, a
    dataclass, a dict for a JSON schema), ``data`` as JSON (what travels with the turn)."""

    value: Any
    data: Any


@dataclass(frozen=True)
class OutputShape:
    """An output type resolved: the spec asked of the model and how answers are checked
    (``adapter`` for a Python type; None: by the spec's JSON schema)."""

    spec: OutputSpec
    adapter: TypeAdapter[Any] | None = None

    def parse(self, text: str) -> TypedOutput:
        """The answer ``text`` validated.

        Raises:
            OutputValidationError: it is not JSON or does not fit (``errors`` says why).
        """
        text = _unfenced(text)
        if self.adapter is not None:
            try:
                value = self.adapter.validate_json(text)
            except ValidationError as exc:
                raise _invalid(text, [_pydantic_line(e) for e in exc.errors()]) from None
            return TypedOutput(value, self.adapter.dump_python(value, mode="json"))
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise _invalid(text, [f"the answer is not JSON ({exc})"]) from None
        errors = _json_schema.errors_of(data, self.spec.json_schema)
        if errors:
            raise _invalid(text, errors)
        return TypedOutput(data, data)

    def judge(self, messages: list[Message], retries: int) -> TypedOutput | Message:
        """The last of ``messages`` (the turn so far, ending with the model's final answer)
        checked: its typed output, or the retry prompt to send while ``retries`` are left.

        The retries already spent are counted from the turn itself (each is a retry
        prompt in it), so a turn run again from its journal goes on where it was.

        Raises:
            OutputValidationError: the answer does not fit and no retry is left.
        """
        answer = messages[-1]
        try:
            return self.parse(answer.text)
        except OutputValidationError as exc:
            spent = sum(1 for m in messages[1:] if m.role == MessageRole.SYSTEM)
            if spent >= retries:
                raise OutputValidationError(
                    f"the model's answer does not fit the output type {self.spec.name!r}"
                    f" after {spent} {'retry' if spent == 1 else 'retries'}:"
                    f" {'; '.join(exc.errors[:3])}; raise"
                    " output_retries, loosen the type, or use a model that supports"
                    " structured output",
                    answer=answer.text[:MAX_ANSWER_CHARS],
                    errors=exc.errors,
                    output=self.spec.name,
                ) from None
            return retry_prompt(self.spec, exc.errors)

    def instructions(self) -> str:
        """The schema as instructions, for a model that cannot be asked for it."""
        schema = json.dumps(self.spec.json_schema, separators=(",", ":"))
        return (
            f"Answer with only a JSON value that fits the JSON schema named {self.spec.name!r}"
            f" below: no other text, no code fences.\nSchema: {schema}"
        )


def retry_prompt(spec: OutputSpec, errors: list[str]) -> Message:
    """What the model is told when its answer does not fit.

    A system message, not a user one: a user message opens a new turn in the data model
    (windows, stored elements and summaries count turns by user messages), and this is
    the application speaking, like the instructions. It is stored with the turn, as the
    rejected answer before it is: the turn keeps what was really exchanged (as it keeps
    tool calls), and its usage counts the rejected answer's tokens, which were spent.
    Every model wire sends it where it stands (Anthropic's, which has no system role among
    its messages, as user-side text): a retry request ends with it, and a later turn does
    not carry it as a standing instruction.
    """
    lines = "\n".join(f"- {e}" for e in errors[:_MAX_ERRORS])
    return Message.system(
        f"Your answer does not fit the required output schema {spec.name!r}:\n{lines}\n"
        "Answer again with only a JSON value that fits the schema."
    )


def instructions_for(
    instructions: str | None, shape: OutputShape | None, model: object
) -> str | None:
    """The instructions to send: a model that does not declare ``structured_output`` gets
    the output schema appended to them."""
    if shape is None or getattr(model, "structured_output", False) is True:
        return instructions
    return f"{instructions}\n\n{shape.instructions()}" if instructions else shape.instructions()


def output_shape(output_type: OutputType | OutputSpec | OutputShape | None) -> OutputShape | None:
    """Resolve an output type (None: free text).

    Raises:
        InvalidOutputTypeError: not a pydantic model, dataclass, object JSON schema or
            OutputSpec; a schema convoq cannot check or larger than MAX_OUTPUT_SCHEMA_BYTES.
    """
    if output_type is None or isinstance(output_type, OutputShape):
        return output_type
    if isinstance(output_type, OutputSpec):
        # Checked like any schema, but sent as given (its own ``strict`` included).
        _checked_spec(output_type.name, output_type.json_schema)
        return OutputShape(output_type)
    if isinstance(output_type, dict):
        name = output_type.get("title") if isinstance(output_type.get("title"), str) else None
        return OutputShape(_checked_spec(_spec_name(name or "output"), output_type))
    if isinstance(output_type, type) and (
        issubclass(output_type, BaseModel) or dataclasses.is_dataclass(output_type)
    ):
        adapter: TypeAdapter[Any] = TypeAdapter(output_type)
        schema = _closed(adapter.json_schema())
        return OutputShape(_spec(_spec_name(output_type.__name__), schema), adapter)
    raise InvalidOutputTypeError(
        "output_type must be a pydantic model class, a dataclass or the JSON schema of an"
        f" object (a dict), not {output_type!r:.100}"
    )


def spec_from_data(data: Any) -> OutputShape:
    """The output shape kept with a queued turn (an OutputSpec's JSON), checked again:
    the record is data from outside the worker."""
    try:
        spec = OutputSpec.model_validate(data)
    except ValidationError as exc:
        raise InvalidOutputTypeError(
            f"the turn's output spec is not valid: {exc.errors()[0]['msg']}"
        ) from None
    shape = output_shape(spec)
    assert shape is not None
    return shape


def shape_for(spec: OutputSpec, *known: OutputShape | None) -> OutputShape:
    """The shape of ``spec`` (kept as JSON with a turn): the first of ``known`` with that
    very spec, so the answer comes back typed; else one checking the spec's schema."""
    for shape in known:
        if shape is not None and shape.spec == spec:
            return shape
    return spec_from_data(spec.model_dump(mode="json"))


def typed(value: Any, output_type: OutputType | None) -> Any:
    """A turn's output JSON (``value``) as ``output_type`` (None or a schema: unchanged).

    Raises:
        OutputValidationError: ``value`` does not fit ``output_type``.
    """
    shape = output_shape(output_type)
    if shape is None or shape.adapter is None:
        return value
    return shape.parse(json.dumps(value)).value


def _checked_spec(name: str, schema: Any) -> OutputSpec:
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise InvalidOutputTypeError(
            "an output JSON schema must describe an object ({'type': 'object', ...}): the"
            " answer's top level is a JSON object"
        )
    _check_size(schema)  # first: a huge or deeply nested schema is not walked
    _json_schema.check_schema(schema)
    return _spec(name, schema)


def _spec(name: str, schema: dict[str, Any]) -> OutputSpec:
    _check_size(schema)
    return OutputSpec(name=name, json_schema=schema, strict=_strict_ready(schema))


def _check_size(schema: dict[str, Any]) -> None:
    try:
        size = len(json.dumps(schema, allow_nan=False).encode())
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidOutputTypeError(
            f"the output schema is not plain JSON ({type(exc).__name__})"
        ) from None
    if size > MAX_OUTPUT_SCHEMA_BYTES:
        raise InvalidOutputTypeError(
            f"the output schema is {size} bytes as JSON; at most {MAX_OUTPUT_SCHEMA_BYTES}"
        )


def _spec_name(name: str) -> str:
    """A name the APIs accept (letters, digits, _ and -, at most 64)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "output"


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """A Python type's schema with every object closed (``additionalProperties: false``,
    as strict mode wants): pydantic ignores extra keys, so nothing valid is refused."""

    def close(node: Any) -> Any:
        if isinstance(node, list):
            return [close(n) for n in node]
        if not isinstance(node, dict):
            return node
        out = {k: close(v) for k, v in node.items()}
        if out.get("type") == "object" and "properties" in out:
            out.setdefault("additionalProperties", False)
        return out

    closed = close(schema)
    assert isinstance(closed, dict)
    return closed


def _strict_ready(node: Any) -> bool:
    """Whether a schema meets strict mode's rules: every object closed, all properties
    required (an optional field makes the request non-strict, not invalid)."""
    if isinstance(node, list):
        return all(_strict_ready(n) for n in node)
    if not isinstance(node, dict):
        return True
    if node.get("type") == "object" or "properties" in node:
        props = node.get("properties") or {}
        if node.get("additionalProperties") is not False or set(props) - set(
            node.get("required") or []
        ):
            return False
    return all(_strict_ready(v) for k, v in node.items() if k not in ("enum", "const", "default"))


def _unfenced(text: str) -> str:
    """The answer without a Markdown code fence around it (models asked by instructions
    often add one)."""
    text = text.strip()
    fenced = _FENCE.match(text)
    return fenced.group(1) if fenced else text


def _pydantic_line(error: Any) -> str:
    place = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
    return f"${place}: {error['msg']}"


def _invalid(text: str, errors: list[str]) -> OutputValidationError:
    return OutputValidationError(
        f"the answer does not fit the output type: {'; '.join(errors[:3])}",
        answer=text[:MAX_ANSWER_CHARS],
        errors=[e[:_MAX_ERROR_CHARS] for e in errors[:_MAX_ERRORS]],
    )

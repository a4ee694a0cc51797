"""Model settings: :class:`ModelSettings`, the sampling and tool-use settings of a model
request, and how users give them (a ModelSettings or a plain dict): checked once where
they enter (an Agent, a call, a submit), merged agent < call, and carried with a queued
turn as JSON. ``convoq.models`` names ModelSettings too (it is part of a
:class:`~convoq.models.ModelRequest`); this module, below the models, is its one home.

Checked strictly: ``max_tokens=True`` or ``seed=1.5`` is a mistake, not a number to coerce.
A named ``tool_choice`` must be a tool name the API accepts and, where the tools are known
(an Agent, a worker's profile), one of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from convoq.errors import InvalidModelSettingsError

ToolChoice = Literal["auto", "required", "none"] | str
"""``auto``, ``required``, ``none``, or the name of the one tool the model must call."""


class ModelSettings(BaseModel):
    """Sampling and tool-use settings of a request; ``None`` leaves the server's default.

    Every model API maps these to its own fields (``max_tokens`` is Chat Completions'
    ``max_completion_tokens``, Responses' ``max_output_tokens``, Anthropic's
    ``max_tokens``); ``extra_body`` is merged into the request body last, for the rest.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, gt=0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    stop: list[str] | None = Field(default=None, max_length=4)
    seed: int | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    extra_body: dict[str, Any] | None = None


SettingsLike = ModelSettings | Mapping[str, Any]
"""A :class:`ModelSettings`, or a dict of its fields (as JSON gives them)."""

MAX_EXTRA_BODY_BYTES = 16 * 1024
MAX_STOP_CHARS = 256
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_CHOICES = ("auto", "required", "none")


def coerce_settings(value: SettingsLike | None) -> ModelSettings | None:
    """``value`` checked as settings (None stays None).

    Raises:
        InvalidModelSettingsError: not a dict or ModelSettings, an unknown field, a value
            of the wrong type or out of range, an extra_body that is not a JSON object of
            at most MAX_EXTRA_BODY_BYTES.
    """
    if value is None:
        return None
    if isinstance(value, ModelSettings):
        data: Any = value.model_dump(exclude_unset=True)
    elif isinstance(value, Mapping):
        data = dict(value)
    else:
        raise InvalidModelSettingsError(
            f"model_settings must be a dict or a ModelSettings, not {type(value).__name__}"
        )
    try:
        settings = ModelSettings.model_validate(data, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"][:1]) or "model_settings"
        raise InvalidModelSettingsError(
            f"model_settings.{field}: {first['msg']} (got {first.get('input')!r:.100});"
            f" fields are {sorted(ModelSettings.model_fields)}",
            field=field,
        ) from None
    _check_tool_choice_form(settings.tool_choice)
    _check_extra_body(settings.extra_body)
    if any(not 0 < len(stop) <= MAX_STOP_CHARS for stop in settings.stop or []):
        raise InvalidModelSettingsError(
            f"model_settings.stop: each stop sequence has 1 to {MAX_STOP_CHARS} characters",
            field="stop",
        )
    return settings


def _check_tool_choice_form(choice: str | None) -> None:
    if choice is None or choice in _CHOICES:
        return
    if not _TOOL_NAME.match(choice):
        raise InvalidModelSettingsError(
            f"model_settings.tool_choice must be 'auto', 'required', 'none' or a tool name"
            f" (letters, digits, _ and -, at most 64), not {choice[:100]!r}",
            field="tool_choice",
        )


def _check_extra_body(extra: dict[str, Any] | None) -> None:
    if extra is None:
        return
    try:
        size = len(json.dumps(extra, allow_nan=False).encode())
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidModelSettingsError(
            f"model_settings.extra_body must be plain JSON (it travels with the turn): {exc}",
            field="extra_body",
        ) from None
    if size > MAX_EXTRA_BODY_BYTES:
        raise InvalidModelSettingsError(
            f"model_settings.extra_body is {size} bytes as JSON; at most"
            f" {MAX_EXTRA_BODY_BYTES} are allowed",
            field="extra_body",
        )


def check_tool_choice(settings: ModelSettings | None, tools: Collection[str]) -> None:
    """A named ``tool_choice`` must be one of ``tools``.

    Raises:
        InvalidModelSettingsError: it names a tool the agent does not have.
    """
    choice = settings.tool_choice if settings is not None else None
    if choice is None or choice in _CHOICES:
        return
    if choice not in tools:
        raise InvalidModelSettingsError(
            f"model_settings.tool_choice names {choice!r}, which is not a tool of this agent;"
            f" its tools are {sorted(tools)}",
            field="tool_choice",
        )


def merge_settings(
    base: ModelSettings | None, override: ModelSettings | None
) -> ModelSettings | None:
    """``override``'s fields over ``base``'s (a field ``override`` leaves None keeps
    ``base``'s); ``extra_body`` is merged key by key, ``override``'s keys winning."""
    if override is None or base is None:
        return base if override is None else override
    merged = base.model_dump(exclude_none=True)
    over = override.model_dump(exclude_none=True)
    extra = {**(merged.pop("extra_body", None) or {}), **(over.pop("extra_body", None) or {})}
    merged.update(over)
    if extra:
        merged["extra_body"] = extra
    return ModelSettings(**merged)


def settings_to_data(settings: ModelSettings | None) -> dict[str, Any] | None:
    """The JSON form kept with a queued turn (fields left None are left out)."""
    return None if settings is None else settings.model_dump(mode="json", exclude_none=True)

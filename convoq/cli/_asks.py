"""``convoq submit``'s model options: JSON from the command line, checked before any
connection is made (a mistake is one line, nothing is queued)."""

from __future__ import annotations

import json
from typing import Any

from convoq.errors import InvalidModelSettingsError, InvalidOutputTypeError
from convoq.model_settings import coerce_settings, settings_to_data
from convoq.output import output_shape


def submit_asks(
    settings_json: str | None,
    schema_json: str | None,
    temperature: float | None,
    max_tokens: int | None,
) -> dict[str, Any]:
    """The ``model_settings`` and ``output_type`` arguments of ``submit`` (only those
    given); ``--temperature`` and ``--max-tokens`` win over the same keys in the JSON.
    ``--output-schema`` keeps its name: on the command line the output type can only be
    a JSON schema, as in the gateway's ``output_schema`` field."""
    asked: dict[str, Any] = {}
    settings = _json_object(settings_json, "--model-settings", InvalidModelSettingsError)
    given = {"temperature": temperature, "max_tokens": max_tokens}
    settings = {**(settings or {}), **{k: v for k, v in given.items() if v is not None}}
    if settings:
        asked["model_settings"] = settings_to_data(coerce_settings(settings))
    schema = _json_object(schema_json, "--output-schema", InvalidOutputTypeError)
    if schema is not None:
        output_shape(schema)
        asked["output_type"] = schema
    return asked


def _json_object(
    raw: str | None, option: str, error: type[InvalidModelSettingsError | InvalidOutputTypeError]
) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise error(f"{option} is not JSON ({exc}); pass a JSON object") from None
    if not isinstance(value, dict):
        raise error(f"{option} must be a JSON object, not {type(value).__name__}")
    return value

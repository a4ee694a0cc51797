"""Pieces every wire format needs the same way: attachments as base64, counts, settings
merged last, strict-schema checks. Pure functions, no I/O."""

from __future__ import annotations

import base64
import json
import math
import mimetypes
from collections.abc import Mapping
from typing import Any

from convoq.errors import ModelError, TruncatedAnswerError
from convoq.messages import FilePart, ImagePart, Message
from convoq.model_settings import ModelSettings
from convoq.models._openai_wire import assemble
from convoq.models._sse import excerpt
from convoq.models.base import ModelRequest

Json = dict[str, Any]


def b64(part: ImagePart | FilePart) -> str:
    return base64.b64encode(part.data).decode("ascii")


def data_url(part: ImagePart | FilePart) -> str:
    return f"data:{part.mime_type};base64,{b64(part)}"


def file_name(part: FilePart) -> str:
    """The part's file name, or one made from its MIME type (APIs want a name)."""
    return part.filename or "attachment" + (mimetypes.guess_extension(part.mime_type) or "")


def load_json(raw: str | bytes, what: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        raise ModelError(f"the model {what} is not JSON: {excerpt(raw)}") from None


def count(value: Any) -> int:
    """A token count as servers send it; null, floats and nonsense count 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return max(0, int(value)) if math.isfinite(value) else 0


def get(data: Any, *path: str) -> Any:
    """``data[a][b]...`` where each step is a dict holding the key, else None."""
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def merge_extra(body: Json, model_extra: Mapping[str, Any], request: ModelRequest) -> Json:
    """The model's ``extra_body``, then the request's ``settings.extra_body`` (it wins)."""
    body.update(model_extra)
    if request.settings is not None and request.settings.extra_body:
        body.update(request.settings.extra_body)
    return body


def refuse_settings(settings: ModelSettings | None, api: str, *names: str) -> None:
    """ModelError, before any I/O, for settings the API has no field for."""
    if settings is None:
        return
    given = [name for name in names if getattr(settings, name) is not None]
    if given:
        raise ModelError(
            f"the {api} has no {' or '.join(given)} setting; leave it unset for this model"
            " (or pass the API's own field in settings.extra_body)"
        )


def is_strict_schema(schema: Any) -> bool:
    """Whether a JSON schema qualifies for strict mode: every object closed
    (``additionalProperties: false``) with all its properties required, all the way down."""
    if isinstance(schema, list):
        return all(is_strict_schema(s) for s in schema)
    if not isinstance(schema, dict):
        return True
    if schema.get("type") == "object" or "properties" in schema:
        properties = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False:
            return False
        if set(schema.get("required") or []) != set(properties):
            return False
    nested = [schema.get(key) for key in ("items", "anyOf", "allOf", "oneOf", "prefixItems")]
    nested += list((schema.get("properties") or {}).values())
    nested += list((schema.get("$defs") or {}).values())
    return all(is_strict_schema(s) for s in nested if s is not None)


def answer(
    text: str,
    calls: list[tuple[Any, Any, Any]],
    finish_reason: str | None,
    *,
    refusal: str | None = None,
    usage: Any = None,
) -> Message:
    """The assistant message from text and ``(id, name, arguments)`` triples, as
    :func:`convoq.models._openai_wire.assemble` builds it, with advice in the settings'
    terms when the token limit cut the answer off before it began."""
    try:
        return assemble(text, calls, finish_reason, refusal=refusal, usage=usage)
    except TruncatedAnswerError as exc:
        raise TruncatedAnswerError(
            "the model hit its token limit before answering; raise"
            " ModelSettings(max_tokens=...) or shorten the input",
            finish_reason="length",
        ) from exc

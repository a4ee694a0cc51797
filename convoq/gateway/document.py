"""The OpenAPI document: FastAPI's, from what the routes declare, and what it cannot know.

Routes declare their answers with FastAPI's own means: every error status as RFC 9457
problem+json (:func:`errors`, with the headers those answers carry), their bodies, the
bearer scheme (their :class:`~convoq.gateway.auth.Access` dependency), the links from a
submit to its turn and from a turn to its pending approval. :func:`complete` adds what
FastAPI cannot express: the schemas it did not see (the problem, the submit's body read by
hand), the scheme as the document's default (it declares one per operation), and
descriptions in markdown (docstrings are reST). Then what only the deployment knows: its
size limits, whether it can sign callbacks (:func:`with_limits`) and, when the workers
registered them, the agent names a submit may use (:func:`with_agents`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Collection
from typing import Any

from pydantic import BaseModel

from convoq.gateway.problems import PROBLEM_JSON

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "An RFC 9457 problem; `error` carries the ConvoqError it was, if any.",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string"},
        "error": {
            "type": "object",
            "required": ["type", "message", "details"],
            "properties": {
                "type": {"type": "string"},
                "message": {"type": "string"},
                "details": {"type": "object"},
            },
        },
        "errors": {"type": "array", "items": {"type": "object"}},
    },
}

WHY: dict[int, str] = {
    401: "No API key, or an unknown one.",
    403: "The key lacks the scope, or the conversation is outside its prefix.",
    404: "No such turn (it never existed or its record expired).",
    409: "The conversation or turn does not allow it now (busy, already decided or ended).",
    413: "The body, or the turn it carries, is over this deployment's size limits.",
    415: "The body is not in a media type this route reads.",
    422: "The request does not match its schema, or convoq refused it (`error` says why).",
    429: "A limit on queued turns is reached; nothing was queued.",
    500: "An unexpected failure; nothing was written that this answer does not report.",
    503: "Redis or the broker does not answer; try again shortly.",
}
_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}, "required": True}},
    429: {"Retry-After": {"schema": {"type": "string"}, "description": "Seconds to wait."}},
}
# What every route behind a key may answer.
KEYED = (401, 403, 413, 422, 500, 503)
_NEEDS_SECRET = (
    " Needs the deployment's webhook signing secret (CONVOQ_WEBHOOK_SECRET): callbacks go"
    " out signed only."
)
_NO_SECRET = {
    "not": {},
    "description": "This deployment has no webhook signing secret (CONVOQ_WEBHOOK_SECRET),"
    " so it sends no callbacks: a submit with callback_url is refused (422).",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """A route's ``responses`` for the problem+json answers with ``statuses``."""
    problem = {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    return {
        status: {"description": WHY[status], "content": problem}
        | ({"headers": _HEADERS[status]} if status in _HEADERS else {})
        for status in statuses
    }


def complete(document: dict[str, Any], *bodies: type[BaseModel]) -> dict[str, Any]:
    """``document`` (FastAPI's) with the schemas of the problem and of ``bodies`` (read by
    hand), the bearer scheme as the default and its descriptions in markdown."""
    add_schemas(document, *bodies)
    document["components"]["schemas"]["Problem"] = PROBLEM_SCHEMA
    # Every route behind a key declares the scheme; the public ones declare none.
    document["security"] = [{"bearer": []}]
    _markdown(document)
    return document


def add_schemas(document: dict[str, Any], *models: type[BaseModel]) -> dict[str, Any]:
    """Put ``models`` (and the models they use) into the document's components."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return document


# Descriptions come from docstrings (routes, models), written in reST; /docs renders
# markdown, where ``literal`` shows its backticks and :role:`name` its role.
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)
_ROLE = re.compile(r":[a-z]+:`(?:~[\w.]*\.)?([^`]+)`")


def markdown(text: str) -> str:
    """A docstring's reST literals and roles as markdown code."""
    return _ROLE.sub(r"`\1`", _LITERAL.sub(r"`\1`", text))


def _markdown(node: Any) -> None:
    """Every ``description`` under ``node`` in markdown (see :func:`markdown`)."""
    if isinstance(node, list):
        for item in node:
            _markdown(item)
    elif isinstance(node, dict):
        for key, value in node.items():  # only values change: the dict keeps its keys
            if key == "description" and isinstance(value, str):
                node[key] = markdown(value)
            else:
                _markdown(value)


def with_limits(
    document: dict[str, Any], max_turn_bytes: int, *, signs_callbacks: bool
) -> dict[str, Any]:
    """The texts a turn may carry, bounded by this deployment's ``max_turn_bytes``; a
    ``callback_url`` only where the deployment has a secret to sign callbacks with."""
    schemas = document["components"]["schemas"]
    schemas["TextIn"]["properties"]["text"]["maxLength"] = max_turn_bytes
    for option in schemas["TurnRequest"]["properties"]["message"].get("anyOf", []):
        if option.get("type") == "string":
            option["maxLength"] = max_turn_bytes
    form = _submit(document)["content"]["multipart/form-data"]["schema"]
    form["properties"]["text"]["maxLength"] = max_turn_bytes
    for properties in (schemas["TurnRequest"]["properties"], form["properties"]):
        if signs_callbacks:
            field = properties["callback_url"]
            field["description"] = field.get("description", "") + _NEEDS_SECRET
        else:
            properties["callback_url"] = dict(_NO_SECRET)
    return document


def _submit(document: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = document["paths"]["/v1/conversations/{cid}/turns"]["post"]
    return body["requestBody"]  # type: ignore[no-any-return]


def with_agents(document: dict[str, Any], agents: Collection[str]) -> dict[str, Any]:
    """A copy of ``document`` whose submit bodies name the agents a turn may ask for."""
    if not agents:
        return document
    document = copy.deepcopy(document)
    names = sorted(agents)
    document["components"]["schemas"]["TurnRequest"]["properties"]["agent"]["enum"] = names
    form = _submit(document)["content"]["multipart/form-data"]["schema"]
    form["properties"]["agent"]["enum"] = names
    return document

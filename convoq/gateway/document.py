"""The OpenAPI document, completed with what FastAPI cannot see.

FastAPI describes the routes and their bodies; this module adds what the gateway's own
machinery answers: every error status a route can give, as RFC 9457 problem+json with its
schema (auth, sizes, media types, validation, conflicts, limits, Redis down, bugs), the
headers those answers carry, the bearer scheme (none on ``/healthz`` and ``/readyz``), the
bodies read by hand (:mod:`.bodies`), the links from a submit to its turn and from a turn to
its pending approvals (so a client, or a fuzzer's stateful phase, can follow them), the size
limits of this deployment, whether it can sign callbacks and, when the workers registered
them, the agent names a submit may use.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Collection
from typing import Any

from pydantic import BaseModel

from convoq.gateway.bodies import add_schemas, not_null
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
_PUBLIC = {"/healthz", "/readyz"}
_TURNS = "/v1/conversations/{cid}/turns"
_TURN = _TURNS + "/{tid}"
# OpenAPI links: (path, method, status) -> link name -> (target path, method, parameters).
# Values starting with "$" are runtime expressions on the answer; others are constants.
# A submit's answer and a turn's view both name the turn this way.
_THE_TURN = {"path.cid": "$response.body#/conversation_id", "path.tid": "$response.body#/turn_id"}
_LINKS: dict[tuple[str, str, str], dict[str, tuple[str, str, dict[str, Any]]]] = {
    (_TURNS, "post", "202"): {
        # Until settled: the answer comes once the turn is final or parked for approval.
        "Turn": (_TURN, "get", {**_THE_TURN, "query.wait": 10, "query.until": "settled"}),
        "Events": (_TURN + "/events", "get", {**_THE_TURN, "query.until": "settled"}),
        "Cancel": (_TURN + "/cancel", "post", _THE_TURN),
    },
    (_TURN, "get", "200"): {
        "DecidePending": (
            _TURN + "/approvals/{call_id}",
            "post",
            {**_THE_TURN, "path.call_id": "$response.body#/pending_approvals/0/id"},
        ),
        "Discard": (_TURN + "/discard", "post", _THE_TURN),
    },
}
_NEEDS_SECRET = (
    " Needs the deployment's webhook signing secret (CONVOQ_WEBHOOK_SECRET): callbacks go"
    " out signed only."
)
_NO_SECRET = {
    "not": {},
    "description": "This deployment has no webhook signing secret (CONVOQ_WEBHOOK_SECRET),"
    " so it sends no callbacks: a submit with callback_url is refused (422).",
}
_MUTATING = {"post", "delete"}


def complete(document: dict[str, Any], *bodies: type[BaseModel]) -> dict[str, Any]:
    """``document`` (FastAPI's) with the errors, security and hand-read bodies added."""
    components = document.setdefault("components", {})
    components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    document["security"] = [{"bearer": []}]
    add_schemas(document, *bodies)
    schemas = components["schemas"]
    schemas["Problem"] = PROBLEM_SCHEMA
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            _complete_operation(path, method, operation)
    _add_links(document["paths"])
    _markdown(document)
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


def _add_links(paths: dict[str, Any]) -> None:
    for (path, method, status), links in _LINKS.items():
        answer = paths[path][method]["responses"][status]
        answer["links"] = {
            name: {"operationId": paths[target][verb]["operationId"], "parameters": parameters}
            for name, (target, verb, parameters) in links.items()
        }


def _statuses(path: str, method: str, operation: dict[str, Any]) -> list[int]:
    if path in _PUBLIC:
        return [500]
    found = [401, 403, 413, 422, 500, 503]
    if "{tid}" in path:
        found.append(404)
    if "requestBody" in operation:
        found.append(415)
    if method in _MUTATING and path.startswith("/v1/conversations/"):
        found.append(409)
    if method == "post" and path.endswith("/turns"):
        found.append(429)
    return sorted(found)


def _complete_operation(path: str, method: str, operation: dict[str, Any]) -> None:
    for parameter in operation.get("parameters", []):
        parameter["schema"] = not_null(parameter["schema"])  # sent or not, never null
    responses = operation.setdefault("responses", {})
    if path in _PUBLIC:
        operation["security"] = []  # no key needed: probes and load balancers call these
    if "202" in responses:
        responses["202"]["headers"] = {
            "Location": {"schema": {"type": "string"}, "required": True,
                         "description": "The turn's URL (links.self)."}
        }  # fmt: skip
    for status in _statuses(path, method, operation):
        entry: dict[str, Any] = {
            "description": WHY[status],
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        if status in _HEADERS:
            entry["headers"] = _HEADERS[status]
        responses[str(status)] = entry


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

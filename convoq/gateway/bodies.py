"""Request bodies read by hand, after the caller was authenticated.

FastAPI reads a declared body before it runs the route's dependencies, so a request with a
bad key and a bad body would get 422 instead of 401. Routes here take the ``Request`` and
read their body once the auth dependency passed; the schema is added to the OpenAPI
document by name (:func:`body_schema`, :func:`add_schemas`). JSON is parsed by pydantic in
JSON mode, which is also what decodes base64 attachments.
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from convoq.gateway.problems import GatewayError

M = TypeVar("M", bound=BaseModel)


def invalid(exc: ValidationError) -> GatewayError:
    errors = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()][:20]
    return GatewayError(
        422, "ValidationError", "the request does not match its schema", errors=errors
    )


async def json_body(request: Request, model: type[M]) -> M:
    """The request's JSON body as ``model``: 415 for another media type, 422 if invalid."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind not in ("application/json", ""):
        raise GatewayError(415, "UnsupportedMediaType", "send application/json")
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        raise invalid(exc) from None


def body_schema(name: str) -> dict[str, Any]:
    """``openapi_extra`` for a route whose JSON body is the model ``name``."""
    ref = {"$ref": f"#/components/schemas/{name}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def add_schemas(document: dict[str, Any], *models: type[BaseModel]) -> dict[str, Any]:
    """Put ``models`` (and the models they use) into the document's components."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return document

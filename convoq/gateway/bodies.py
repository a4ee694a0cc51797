"""Request bodies read by hand, after the caller was authenticated.

FastAPI reads a declared body before it runs the route's dependencies, so a request with a
bad key and a bad body would get 422 instead of 401. Routes here take the ``Request`` and
read their body once the auth dependency passed; the schema is added to the OpenAPI
document by name (:func:`body_schema`, :func:`add_schemas`). JSON is parsed by pydantic in
JSON mode, which is also what decodes base64 attachments.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from convoq.context import MAX_METADATA_BYTES
from convoq.gateway.inputs import TurnOptions, TurnRequest
from convoq.gateway.problems import GatewayError
from convoq.messages import FilePart, ImagePart, Message, TextPart

MAX_FILES = 64
MAX_FIELDS = 32
# A metadata field may be pretty-printed JSON: room for whitespace around its 16 KiB.
MAX_METADATA_FIELD_BYTES = 4 * MAX_METADATA_BYTES

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


async def turn_body(request: Request) -> tuple[TurnOptions, str | Message]:
    """A submit's options and message: JSON (:class:`TurnRequest`) or multipart (the
    options as form fields, a ``text`` and any ``files``); 415 for another media type,
    422 if it does not match its schema."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "multipart/form-data":
        body = await json_body(request, TurnRequest)
        return body, body.user_message()
    try:
        form = await request.form(max_files=MAX_FILES, max_fields=MAX_FIELDS)
    except HTTPException as exc:  # starlette's 400 for a form it cannot read
        raise GatewayError(422, "ValidationError", f"the multipart body: {exc.detail}") from None
    text = form.get("text")
    if not isinstance(text, str) or not text:
        missing = [{"loc": ["text"], "msg": "required, at least 1 character"}]
        raise GatewayError(
            422, "ValidationError", "a multipart turn needs a non-empty text", errors=missing
        )
    content: list[TextPart | ImagePart | FilePart] = [TextPart(text=text)]
    for upload in form.getlist("files"):
        if not isinstance(upload, UploadFile):
            not_file = [{"loc": ["files"], "msg": "not a file"}]
            raise GatewayError(
                422, "ValidationError", "files must be file uploads, not fields", errors=not_file
            )
        data = await upload.read()
        mime = upload.content_type or "application/octet-stream"
        if mime.startswith("image/"):
            content.append(ImagePart(data=data, mime_type=mime))
        else:
            content.append(FilePart(data=data, mime_type=mime, filename=upload.filename))
    fields: dict[str, Any] = {k: v for k, v in form.multi_items() if k not in ("text", "files")}
    if "metadata" in fields:
        fields["metadata"] = _form_metadata(fields["metadata"])
    try:
        options = TurnOptions.model_validate(fields)
    except ValidationError as exc:
        raise invalid(exc) from None
    return options, Message(content=content)


def _form_metadata(field: object) -> dict[str, Any]:
    """The JSON object a multipart ``metadata`` field holds: 413 over
    :data:`MAX_METADATA_FIELD_BYTES`, 422 for a file, bad JSON or another JSON value (its
    size as compact JSON is the client's check, the one every entry point has)."""
    if not isinstance(field, str):
        raise _bad_metadata("a form field holding a JSON object, not a file")
    size = len(field.encode())
    if size > MAX_METADATA_FIELD_BYTES:
        raise GatewayError(
            413,
            "RequestTooLarge",
            f"the metadata field is {size} bytes, over {MAX_METADATA_FIELD_BYTES}; metadata"
            f" may be {MAX_METADATA_BYTES} bytes as compact JSON",
            limit=MAX_METADATA_FIELD_BYTES,
        )
    try:
        value = json.loads(field)
    except ValueError as exc:
        raise _bad_metadata(f'a JSON object, e.g. {{"customer": "c-42"}} ({exc})') from None
    if not isinstance(value, dict):
        raise _bad_metadata(f"a JSON object, not a JSON {type(value).__name__}")
    return value


def _bad_metadata(wanted: str) -> GatewayError:
    problem = [{"loc": ["metadata"], "msg": f"must be {wanted}"}]
    return GatewayError(
        422, "ValidationError", f"the metadata field must be {wanted}", errors=problem
    )


def multipart_schema() -> dict[str, Any]:
    """The multipart form of a submit: :class:`TurnOptions` as fields, plus ``text``
    (required) and ``files``. ``metadata`` is an object: in a multipart body its part
    holds the object's JSON (OpenAPI's default encoding of an object property)."""
    schema = TurnOptions.model_json_schema()
    # A form field is a string or absent, never null.
    properties = {name: not_null(field) for name, field in schema["properties"].items()}
    properties["text"] = {"type": "string", "minLength": 1, "description": "The user's text."}
    properties["files"] = {
        "type": "array",
        "maxItems": MAX_FILES,
        "items": {"type": "string", "format": "binary", "minLength": 1},
        "description": "Attachments: image/* become image parts, anything else file parts.",
    }
    return {
        "type": "object",
        "required": ["agent", "text"],
        "properties": properties,
        "additionalProperties": False,
    }


def not_null(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` without its null alternative (and null default): for values that are
    either given or absent, such as form fields, headers and query parameters."""
    options = schema.get("anyOf")
    if not isinstance(options, list) or {"type": "null"} not in options:
        return schema
    rest = [o for o in options if o != {"type": "null"}]
    merged = {
        k: v for k, v in schema.items() if k != "anyOf" and not (k == "default" and v is None)
    }
    return {**merged, **rest[0]} if len(rest) == 1 else {**merged, "anyOf": rest}

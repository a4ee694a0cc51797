"""Request bodies, read once the caller is authenticated.

FastAPI reads and parses a declared body before it runs the route's dependencies, so a
request with a bad key and a bad body would get 422 instead of 401. :class:`GatewayRoute`,
the route class of every router here, checks the key first and then lets FastAPI read the
body its route declares (JSON is parsed as pydantic parses it, see :class:`_JsonRequest`).

A submit takes JSON or a multipart form on one operation, and FastAPI reads a route's body
one way (JSON or form fields), chosen when the route is declared: that body is read here by
hand (:func:`turn_body`), after the key was checked, and documented by
:func:`submit_body`. The form has answers FastAPI's form fields would not give (its
``metadata`` field's JSON, a 413 for an oversize one, files that are not uploads).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

import pydantic_core
from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from convoq.context import MAX_METADATA_BYTES
from convoq.gateway.auth import Access
from convoq.gateway.inputs import TurnOptions, TurnRequest, not_null
from convoq.gateway.problems import JSON_TYPES, GatewayError, media_type
from convoq.messages import FilePart, ImagePart, Message, TextPart

MAX_FILES = 64
MAX_FIELDS = 32
# A metadata field may be pretty-printed JSON: room for whitespace around its 16 KiB.
MAX_METADATA_FIELD_BYTES = 4 * MAX_METADATA_BYTES


class _JsonRequest(Request):
    """JSON parsed by pydantic's parser, as the bodies read by hand are: a body that is not
    UTF-8 is a 422 (:func:`json.loads` would make it a 400, or read UTF-16)."""

    async def json(self) -> Any:
        body = await self.body()
        if media_type(self) not in JSON_TYPES:
            # FastAPI parses every +json type; the gateway reads application/json. Like
            # a body of any other type, it goes to validation as bytes: a 415 (problems).
            return body
        try:
            return pydantic_core.from_json(body)
        except ValueError as exc:  # FastAPI answers this one as a 422 json_invalid
            raise json.JSONDecodeError(str(exc), body.decode("utf-8", "replace"), 0) from None


class GatewayRoute(APIRoute):
    """A route whose :class:`~convoq.gateway.auth.Access` dependencies run before FastAPI
    reads the body (and again as dependencies, handing the endpoint its principal: the
    same answer, from the same request)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        checks = [d.call for d in self.dependant.dependencies if isinstance(d.call, Access)]

        async def key_first(request: Request) -> Response:
            for access in checks:
                access.check(request)
            return await handle(_JsonRequest(request.scope, request.receive))

        return key_first


def invalid(exc: ValidationError) -> GatewayError:
    errors = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()][:20]
    return GatewayError(
        422, "ValidationError", "the request does not match its schema", errors=errors
    )


async def turn_body(request: Request) -> tuple[TurnOptions, str | Message]:
    """A submit's options and message: JSON (:class:`TurnRequest`) or multipart (the
    options as form fields, a ``text`` and any ``files``); 415 for another media type,
    422 if it does not match its schema."""
    kind = media_type(request)
    if kind == "multipart/form-data":
        return await _form_body(request)
    if kind not in JSON_TYPES:
        raise GatewayError(415, "UnsupportedMediaType", "send application/json")
    try:
        body = TurnRequest.model_validate_json(await request.body())
    except ValidationError as exc:
        raise invalid(exc) from None
    return body, body.user_message()


async def _form_body(request: Request) -> tuple[TurnOptions, Message]:
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


def submit_body() -> dict[str, Any]:
    """The submit's ``openapi_extra``: its body, as JSON (:class:`TurnRequest`, which
    :func:`convoq.gateway.document.complete` adds to the schemas) or as a multipart form."""
    turn_request = {"$ref": "#/components/schemas/TurnRequest"}
    content = {
        "application/json": {"schema": turn_request},
        "multipart/form-data": {"schema": multipart_schema()},
    }
    return {"requestBody": {"required": True, "content": content}}


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

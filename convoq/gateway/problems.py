"""Errors as RFC 9457 ``application/problem+json``, carrying the ConvoqError they were.

Every error answer has the same shape::

    {"type": "urn:convoq:error:UnknownTurnError", "title": "UnknownTurnError",
     "status": 404, "detail": "...", "error": {"type": ..., "message": ..., "details": ...}}

``error`` is :meth:`ConvoqError.to_data`, so a client in any language can rebuild the
error (Python: :func:`convoq.errors.error_from_data`).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException
from starlette.routing import Match

from convoq.errors import (
    AttachmentError,
    ConfigurationError,
    ConversationBusyError,
    ConversationMemoryError,
    ConvoqError,
    IdempotencyKeyReusedError,
    InvalidMessageError,
    ProtocolError,
    QueueFullError,
    RedisUnavailableError,
    SignalBacklogFullError,
    TurnTimeoutError,
    UnknownTurnError,
)
from convoq.redis._cluster import CLUSTER_UNAVAILABLE

PROBLEM_JSON = "application/problem+json"
TYPE_PREFIX = "urn:convoq:error:"
log = logging.getLogger("convoq.gateway")

# Most specific first: the first class the error is an instance of gives the status.
_STATUS: tuple[tuple[type[ConvoqError], int], ...] = (
    (UnknownTurnError, 404),
    (QueueFullError, 429),
    (SignalBacklogFullError, 429),
    (ConversationBusyError, 409),
    (IdempotencyKeyReusedError, 409),
    (ProtocolError, 409),
    (TurnTimeoutError, 504),
    (RedisUnavailableError, 503),
    (ConversationMemoryError, 503),
    (ConfigurationError, 503),
    (ConvoqError, 422),
)


class GatewayError(Exception):
    """An error of the gateway itself (auth, sizes, routes), not of convoq's library."""

    def __init__(self, status: int, title: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail, self.extra = status, title, detail, extra


def problem(
    status: int, title: str, detail: str, *, retry_after_s: float | None = None, **extra: Any
) -> JSONResponse:
    """A problem+json response (with ``Retry-After`` in whole seconds when given)."""
    body = {"type": TYPE_PREFIX + title, "title": title, "status": status, "detail": detail}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    if retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return JSONResponse({**body, **extra}, status_code=status, media_type=PROBLEM_JSON,
                        headers=headers or None)  # fmt: skip


def status_of(error: ConvoqError) -> int:
    if isinstance(error, (AttachmentError, InvalidMessageError)) and "limit" in error.details:
        return 413  # a size limit of convoq.limits: the content is too large, not malformed
    return next(code for cls, code in _STATUS if isinstance(error, cls))


def convoq_problem(error: ConvoqError) -> JSONResponse:
    data = error.to_data()
    # A full queue is "too many requests": the client is told when to come back.
    retry = error.retry_after_s if isinstance(error, QueueFullError) else None
    return problem(status_of(error), data["type"], error.message, retry_after_s=retry,
                   error=data)  # fmt: skip


# The media types read as JSON: a body without a Content-Type is read as JSON too.
JSON_TYPES = ("application/json", "")


def media_type(request: Request) -> str:
    """The request's media type, lowercase, without parameters ("" if none)."""
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


def _shown(error: Any) -> dict[str, Any]:
    """A validation error as the answer lists it: where in the body (or ``query``,
    ``path``, ``header``) and what; JSON that does not parse in pydantic's words."""
    loc = list(error.get("loc", ()))
    if error.get("type") == "json_invalid":
        return {"loc": [], "msg": f"Invalid JSON: {error.get('ctx', {}).get('error', '')}"}
    return {"loc": loc[1:] if loc[:1] == ["body"] else loc, "msg": str(error.get("msg", ""))}


_METHODS = ("DELETE", "GET", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path (Starlette names only those
    of the first route matching it, and one path may have several routes): each asked of
    the routes through their public ``matches``."""
    routes = request.app.router.routes
    return [
        method
        for method in _METHODS
        if any(r.matches({**request.scope, "method": method})[0] == Match.FULL for r in routes)
    ]


def install(app: FastAPI) -> None:
    """Answer every error of ``app`` as problem+json."""

    @app.exception_handler(ConvoqError)
    async def _convoq(_: Request, exc: ConvoqError) -> JSONResponse:
        return convoq_problem(exc)

    @app.exception_handler(GatewayError)
    async def _gateway(_: Request, exc: GatewayError) -> JSONResponse:
        return problem(exc.status, exc.title, exc.detail, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        outside = [e for e in errors if tuple(e.get("loc", ()))[:1] != ("body",)]
        if outside:
            errors = outside  # the path, query and headers are answered before the body
        elif media_type(request) not in JSON_TYPES:
            # FastAPI hands a body of another media type to validation as its bytes.
            return problem(415, "UnsupportedMediaType", "send application/json")
        shown = [_shown(e) for e in errors[:20]]
        return problem(422, "ValidationError", "the request does not match its schema",
                       errors=shown)  # fmt: skip

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        answer = problem(exc.status_code, "HTTPError", str(exc.detail))
        answer.headers.update(exc.headers or {})
        if exc.status_code == 405:
            answer.headers["Allow"] = ", ".join(allowed_methods(request))
        return answer

    # Anything else is a bug: still problem+json, and the routes build every fallible
    # part of an answer before their first write, so a 500 never hides a change made.
    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        # Starlette logs it (it re-raises to the server once this answer is sent).
        return problem(500, "InternalError", "the gateway failed unexpectedly; it is logged")

    async def _redis_down(_: Request, exc: Exception) -> JSONResponse:
        log.warning("Redis unavailable: %r", exc)
        return problem(503, "RedisUnavailable", "Redis does not answer; try again shortly")

    # A cluster that cannot serve the slot now is, to a caller, a Redis that does not answer.
    unavailable: tuple[type[Exception], ...] = (
        RedisConnectionError, RedisTimeoutError, RedisUnavailableError,
    )  # fmt: skip
    for error in (*unavailable, *CLUSTER_UNAVAILABLE):
        app.add_exception_handler(error, _redis_down)

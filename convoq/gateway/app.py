"""The gateway's ASGI app: :func:`create_app` wires the client, keys, routes and pages.

One :class:`~convoq.client.AsyncClient` per app, opened in the lifespan (its connections
belong to the server's event loop). Settings come from :class:`ConvoqSettings` (explicit
argument > ``CONVOQ_*`` > default) like every other entry point.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from redis.exceptions import RedisError

from convoq import __version__
from convoq.client import AsyncClient
from convoq.errors import ConvoqError
from convoq.gateway import (
    console,
    inbox,
    problems,
    routes_console,
    routes_conversations,
    routes_turns,
    routes_workers,
    routes_world,
)
from convoq.gateway import document as document_of
from convoq.gateway.auth import Access, KeyRing
from convoq.gateway.bodies import GatewayRoute
from convoq.gateway.document import KEYED, errors
from convoq.gateway.inputs import TurnRequest
from convoq.gateway.limits import BodyLimit, max_body_bytes
from convoq.gateway.models import Health
from convoq.observe import metrics
from convoq.pricing import PriceTable
from convoq.settings import ConvoqSettings

READY_TIMEOUT_S = 3.0


def create_app(settings: ConvoqSettings | None = None, **overrides: Any) -> FastAPI:
    """The gateway app for ``settings`` (default: resolved from ``CONVOQ_*``; keyword
    ``overrides`` win over both).

    Raises:
        ConfigurationError: invalid settings.
    """
    s = settings or ConvoqSettings.resolve(**overrides)
    prices = PriceTable.parse(s.model_prices)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = AsyncClient(settings=s)
        app.state.client = client
        try:
            yield
        finally:
            await client.aclose()

    app = FastAPI(
        title="convoq gateway",
        version=__version__,
        summary="Queue AI-agent turns, follow them, approve their tool calls.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        # A body without a Content-Type is read as JSON, as the gateway always has.
        strict_content_type=False,
        generate_unique_id_function=_operation_id,
    )
    app.router.route_class = GatewayRoute
    app.state.keys = KeyRing(s.gateway_api_keys)
    app.state.settings = s
    app.state.prices = prices
    problems.install(app)
    app.include_router(routes_turns.router)
    app.include_router(routes_world.router)
    app.include_router(routes_conversations.router)
    app.include_router(routes_console.router)
    app.include_router(routes_workers.router)
    app.include_router(inbox.router)
    app.include_router(console.router)
    _health_routes(app)
    _metrics_route(app)
    _document(app, s)
    app.add_middleware(BodyLimit, limit=max_body_bytes(s.max_turn_bytes))
    return app


def _operation_id(route: APIRoute) -> str:
    """A route's operation id in the document: its name, which its links name too."""
    return route.name


# Probes and load balancers call these without a key.
_PUBLIC: dict[str, Any] = {"openapi_extra": {"security": []}, "responses": errors(500)}


def _health_routes(app: FastAPI) -> None:
    @app.get(
        "/healthz", response_model=Health, tags=["health"], summary="The process lives", **_PUBLIC
    )
    async def healthz() -> Health:
        return Health(status="ok")

    @app.get(
        "/readyz",
        response_model=Health,
        tags=["health"],
        summary="Redis and the broker answer",
        openapi_extra=_PUBLIC["openapi_extra"],
        responses={503: {"model": Health}, **_PUBLIC["responses"]},
    )
    async def readyz(request: Request) -> Any:
        client: AsyncClient = request.app.state.client
        try:
            await asyncio.wait_for(client.ping(READY_TIMEOUT_S), 2 * READY_TIMEOUT_S + 2)
        except (ConvoqError, TimeoutError) as exc:
            detail = getattr(exc, "message", None) or repr(exc)
            return JSONResponse(
                Health(status="unavailable", detail=detail).model_dump(), status_code=503
            )
        return Health(status="ok")


def _metrics_route(app: FastAPI) -> None:
    """This process's Prometheus metrics (its client's turns submitted, and any other
    convoq metric it updates), for keys with the ``metrics`` scope."""

    @app.get(
        "/metrics",
        tags=["health"],
        summary="Prometheus metrics (scope metrics)",
        response_class=Response,
        dependencies=[Depends(Access("metrics"))],
        responses=errors(*KEYED),
    )
    async def prometheus_metrics() -> Response:
        body, content_type = metrics.metrics_response()
        return Response(body, media_type=content_type)


def _document(app: FastAPI, settings: ConvoqSettings) -> None:
    """``/openapi.json``: FastAPI's document completed (:mod:`.document`) and, when the
    running workers registered their agents, naming them."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = document_of.complete(FastAPI.openapi(app), TurnRequest)
            app.openapi_schema = document_of.with_limits(
                document, settings.max_turn_bytes, signs_callbacks=bool(settings.webhook_secret)
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_json(request: Request) -> JSONResponse:
        client: AsyncClient = request.app.state.client
        try:
            agents = await asyncio.wait_for(client.registered_agents(), READY_TIMEOUT_S)
        except (ConvoqError, RedisError, OSError, TimeoutError):
            agents = frozenset()  # the document still answers while Redis does not
        return JSONResponse(document_of.with_agents(openapi(), agents))

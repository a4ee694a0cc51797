"""``convoq gateway``: the client API over HTTP, an approvals inbox page and a console.

An ASGI app (FastAPI on uvicorn) on top of :class:`convoq.client.AsyncClient`; it never
imports the worker. Modules: :mod:`.app` (the factory), :mod:`.auth` (API keys and
scopes), :mod:`.problems` (RFC 9457 errors), :mod:`.routes_turns` and
:mod:`.routes_conversations` (the API), :mod:`.sse` (event streams), :mod:`.inbox` (the
pages), :mod:`.limits` (request sizes), :mod:`.inputs` (what requests may carry),
:mod:`.models` (answers), :mod:`.bodies` (the key checked before a body is read; the
submit's body read by hand) and :mod:`.document` (the OpenAPI document, every answer in
it). The operators' console: :mod:`.console` (its page), :mod:`.routes_console` and
:mod:`.routes_workers` (the JSON it reads, :mod:`.console_models`), :mod:`.timeline` (a
turn's steps from its events).

Conversation ids travel in the URL path, percent-encoded; an id containing ``/`` cannot
be addressed through the gateway (the path would split), so give such deployments ids
with another separator (``tenant-a:user-42``).
"""

from convoq.gateway.app import create_app

__all__ = ["create_app"]

"""Request size limits: the client's ``max_turn_bytes``, as it arrives over HTTP.

A body larger than the biggest turn the client would accept (base64 adds a third, JSON or
multipart framing a little more) is refused with 413 before it is read in full, whether
it announced its length or not. What gets through is checked again, decoded, by the
client's own limits.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from convoq.gateway.problems import problem

FRAMING_BYTES = 64 * 1024


def max_body_bytes(max_turn_bytes: int) -> int:
    return max_turn_bytes * 4 // 3 + FRAMING_BYTES


class _TooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: 413 for bodies over ``limit`` bytes."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        seen = 0
        started = False

        async def counting() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge
            return message

        async def watching(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting, watching)
        except _TooLarge:
            if not started:
                await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        detail = f"the request body is over {self.limit} bytes (max_turn_bytes, encoded)"
        response: Any = problem(413, "RequestTooLarge", detail, limit=self.limit)
        await response(scope, receive, send)

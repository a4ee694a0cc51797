"""The console's pages: ``/console`` and the files it loads, served by the gateway.

One static page with plain JavaScript and CSS (no build step, nothing from other sites,
a Content-Security-Policy that allows scripts, styles and connections to this origin
only, and images from ``blob:`` URLs the page makes of attachments it fetched). Its
views are addressed in the URL fragment (``#/conversations``, ``#/c/{cid}``,
``#/c/{cid}/t/{tid}``, ``#/workers``); its data comes from the API's JSON routes
(:mod:`.routes_console`, :mod:`.routes_workers`, and the turn routes it acts through)
with the key the user gives it, kept for the tab as the approvals inbox keeps it.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Path
from fastapi.responses import HTMLResponse, Response

from convoq.gateway.problems import GatewayError

router = APIRouter(include_in_schema=False)

CSP = (
    "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self';"
    " img-src 'self' blob:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
# What /console/{name} serves, by the file's type.
FILES = {
    "console.js": "text/javascript",
    "console-views.js": "text/javascript",
    "console-turn.js": "text/javascript",
    "console.css": "text/css",
    "favicon.svg": "image/svg+xml",
}


def _static(name: str) -> str:
    return (resources.files("convoq.gateway") / "static" / name).read_text("utf-8")


@router.get("/console")
async def console_page() -> HTMLResponse:
    return HTMLResponse(_static("console.html"), headers=HEADERS)


@router.get("/console/{name}")
async def console_file(name: str = Path(max_length=64)) -> Response:
    media_type = FILES.get(name)
    if media_type is None:
        raise GatewayError(404, "NotFound", "no such file of the console")
    return Response(_static(name), media_type=media_type, headers=HEADERS)

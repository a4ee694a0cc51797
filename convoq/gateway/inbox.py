"""The pages: the approvals inbox (``/inbox``) and the API reference (``/docs``).

The inbox is a static page with a little vanilla JavaScript (no build step, nothing from
other sites); its data comes from ``GET /v1/approvals`` with the key the user gives it, so
the page needs the approve scope to show anything. The API reference is rendered here
from the OpenAPI document instead of loading Swagger UI from a CDN.
"""

from __future__ import annotations

import html
from importlib import resources
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

router = APIRouter(include_in_schema=False)

_CSP = (
    "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline';"
    " base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": _CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _static(name: str) -> str:
    return (resources.files("convoq.gateway") / "static" / name).read_text("utf-8")


@router.get("/inbox")
async def inbox_page() -> HTMLResponse:
    return HTMLResponse(_static("inbox.html"), headers=_HEADERS)


@router.get("/inbox/inbox.js")
async def inbox_script() -> Response:
    return Response(_static("inbox.js"), media_type="text/javascript", headers=_HEADERS)


@router.get("/docs")
async def docs_page(request: Request) -> HTMLResponse:
    document: dict[str, Any] = request.app.openapi()
    rows = []
    for path, operations in document.get("paths", {}).items():
        for method, op in operations.items():
            rows.append(
                f"<tr><td><code>{html.escape(method.upper())}</code></td>"
                f"<td><code>{html.escape(path)}</code></td>"
                f"<td>{html.escape(op.get('summary', ''))}"
                f"<p>{html.escape(op.get('description', ''))}</p></td></tr>"
            )
    title = html.escape(document["info"]["title"])
    body = (
        f"<!doctype html><html lang=en><meta charset=utf-8><title>{title}</title>"
        "<style>body{font:15px system-ui;margin:2rem}td{vertical-align:top;padding:.3rem}"
        "p{color:#555;margin:.2rem 0}</style>"
        f"<h1>{title} {html.escape(document['info']['version'])}</h1>"
        "<p>Authenticate with <code>Authorization: Bearer &lt;api key&gt;</code>. Errors are"
        " RFC 9457 <code>application/problem+json</code>. Machine-readable: "
        "<a href=/openapi.json>/openapi.json</a>.</p>"
        f"<table>{''.join(rows)}</table></html>"
    )
    return HTMLResponse(body, headers=_HEADERS)

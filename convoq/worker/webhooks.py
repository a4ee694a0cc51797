"""Webhook delivery: one signed POST of a finished turn's payload and whether a retry
makes sense (retrying is the ``convoq.deliver_callback`` task's job). Redirects are never
followed (a redirect could send the signed body elsewhere) and response bodies are not
read. The payload and signature are the queue contract's (:mod:`convoq.queue.signing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import httpx

from convoq.queue.signing import SIGNATURE_HEADER, sign

USER_AGENT = "convoq-webhook/1"

DeliveryOutcome = Literal["delivered", "retry", "rejected"]


@dataclass(frozen=True)
class Attempt:
    """What one POST came to: ``outcome`` and a line for the log."""

    outcome: DeliveryOutcome
    detail: str


async def post_once(url: str, body: bytes, *, secret: str, timeout_s: float) -> Attempt:
    """POST ``body`` once. 2xx delivered; 5xx, 429, timeouts and connection errors retry;
    anything else (4xx, a redirect) is the receiver saying no, so it is not retried."""
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: sign(secret, body),
    }
    try:
        # stream(): the response body is never read, so a huge one costs nothing.
        async with (
            httpx.AsyncClient(follow_redirects=False, timeout=timeout_s) as client,
            client.stream("POST", url, content=body, headers=headers) as response,
        ):
            status = response.status_code
    except httpx.TransportError as exc:
        return Attempt("retry", f"{type(exc).__name__}: {exc}")
    if 200 <= status < 300:
        return Attempt("delivered", f"HTTP {status}")
    if status >= 500 or status == 429:
        return Attempt("retry", f"HTTP {status}")
    return Attempt("rejected", f"HTTP {status}")


def backoff_s(retries: int, base_s: float, cap_s: float = 600.0) -> float:
    """Exponential backoff: base, 2*base, 4*base ... capped."""
    return float(min(cap_s, base_s * (2**retries)))

"""Webhook delivery: one signed POST of a finished turn's payload and whether a retry
makes sense (retrying is the ``convoq.deliver_callback`` task's job). Redirects are never
followed (a redirect could send the signed body elsewhere) and response bodies are not
read. The payload and signature are the queue contract's (:mod:`convoq.queue.signing`).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Literal

import httpcore
import httpx

from convoq.errors import InvalidCallbackUrlError
from convoq.netguard import CallbackPolicy, GuardedBackend, Resolver
from convoq.queue.signing import SIGNATURE_HEADER, sign

USER_AGENT = "convoq-webhook/1"

DeliveryOutcome = Literal["delivered", "retry", "rejected"]


@dataclass(frozen=True)
class Attempt:
    """What one POST came to: ``outcome`` and a line for the log."""

    outcome: DeliveryOutcome
    detail: str


async def post_once(
    url: str,
    body: bytes,
    *,
    secret: str,
    timeout_s: float,
    policy: CallbackPolicy | None = None,
    resolver: Resolver | None = None,
) -> Attempt:
    """POST ``body`` once. 2xx delivered; 5xx, 429, timeouts and connection errors retry;
    anything else (4xx, a redirect) is the receiver saying no, so it is not retried, nor is
    an address ``policy`` refuses (checked on the connection itself: see
    :mod:`convoq.netguard`; default: public addresses only)."""
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: sign(secret, body),
    }
    try:
        # stream(): the response body is never read, so a huge one costs nothing.
        async with (
            httpx.AsyncClient(
                transport=guarded_transport(policy or CallbackPolicy(), resolver),
                follow_redirects=False,
                timeout=timeout_s,
                trust_env=False,  # a proxy would make the guard check the proxy's address
            ) as client,
            client.stream("POST", url, content=body, headers=headers) as response,
        ):
            status = response.status_code
    except InvalidCallbackUrlError as exc:
        return Attempt("rejected", exc.message)
    except httpx.TransportError as exc:
        return Attempt("retry", f"{type(exc).__name__}: {exc}")
    if 200 <= status < 300:
        return Attempt("delivered", f"HTTP {status}")
    if status >= 500 or status == 429:
        return Attempt("retry", f"HTTP {status}")
    return Attempt("rejected", f"HTTP {status}")


def guarded_transport(
    policy: CallbackPolicy,
    resolver: Resolver | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> httpx.AsyncHTTPTransport:
    """An httpx transport that connects only where ``policy`` allows (see
    :class:`convoq.netguard.GuardedBackend`); ``ssl_context``: default, httpx's (system
    CAs, certificates checked against the URL's host name)."""
    transport = httpx.AsyncHTTPTransport(trust_env=False)
    # httpx takes no network backend; its transport delegates every request to this
    # httpcore pool, so the pool is rebuilt around the guarded backend (the TLS context is
    # httpx's default: certificates verified against the URL's host name).
    # tests/test_netguard.py pins this: delivery goes through the guard or fails.
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=ssl_context or httpx.create_ssl_context(trust_env=False),
        network_backend=GuardedBackend(policy, resolver),
    )
    return transport


def backoff_s(retries: int, base_s: float, cap_s: float = 600.0) -> float:
    """Exponential backoff: base, 2*base, 4*base ... capped."""
    return float(min(cap_s, base_s * (2**retries)))

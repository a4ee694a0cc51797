"""Webhook delivery: one signed POST of a finished turn's payload (read from its record)
and whether a retry makes sense (retrying is the ``convoq.deliver_callback`` task's job).
Redirects are never followed (a redirect could send the signed body elsewhere) and
response bodies are not read. The payload and signature are the queue contract's
(:mod:`convoq.queue.signing`).

Every connection goes through the address guard (:mod:`convoq.netguard`): the POST is
sent by :class:`GuardedTransport`, httpx's custom-transport interface over httpcore's
pool with the guarded network backend, and a process checks once (:data:`GUARD`) that
requests built so do reach that backend before it sends any.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import httpcore
import httpx

from convoq.errors import ConfigurationError, InvalidCallbackUrlError, UnknownTurnError
from convoq.netguard import (
    PROBE_URL,
    CallbackPolicy,
    GuardCheck,
    GuardedBackend,
    PoolTransport,
    ProbeBackend,
    Resolver,
)
from convoq.queue.signing import SIGNATURE_HEADER, build_payload, sign
from convoq.redis.protocol import TurnRecord
from convoq.redis.roles import TurnReader

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
        await GUARD.ensure()
    except ConfigurationError as exc:
        return Attempt("rejected", exc.message)
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


async def deliver(
    protocol: TurnReader,
    cid: str,
    tid: str,
    *,
    secret: str | None,
    timeout_s: float,
    policy: CallbackPolicy,
) -> Attempt:
    """POST the callback of turn ``tid`` once (:func:`post_once`), its payload read from
    the turn's record: rejected when the record expired or names no ``callback_url``.

    Raises:
        ConfigurationError: no ``secret`` (callbacks are only sent signed).
    """
    if not secret:
        raise ConfigurationError(
            "a turn has a callback_url but CONVOQ_WEBHOOK_SECRET is not set on the"
            " workers: callbacks are only sent signed"
        )
    try:
        record = await protocol.get_turn(cid, tid)
    except UnknownTurnError:
        return Attempt("rejected", "the turn record expired")
    url = record.options.get("callback_url")
    if not url:
        return Attempt("rejected", "the turn has no callback_url")
    body = _payload(cid, tid, record)
    return await post_once(str(url), body, secret=secret, timeout_s=timeout_s, policy=policy)


def _payload(cid: str, tid: str, record: TurnRecord) -> bytes:
    result = record.result or {}
    return build_payload(
        conversation_id=cid,
        turn_id=tid,
        status=record.status,
        agent=record.agent,
        text=result.get("text"),
        error=record.error,
        finished_ms=record.finished_ms,
        usage=result.get("usage"),
        finish_reason=result.get("finish_reason"),
        output=result.get("output"),
        metadata=record.metadata,
        decisions={call: d.model_dump() for call, d in record.decisions.items()},
        children=result.get("children"),
        parent=record.options.get("subagent"),
        handed_from=record.handed_from,
        texting=_texting(record),
    )


# The most merged turn ids a webhook lists (the record has them all).
MAX_MERGED = 64


def _texting(record: TurnRecord) -> dict[str, Any]:
    """The webhook's double-texting fields of ``record`` (docs/double-texting.md)."""
    said: dict[str, Any] = {}
    if record.stopped_by is not None:
        said["stopped_by"] = record.stopped_by
    if record.merged:
        said["merged"] = list(record.merged[:MAX_MERGED])
    return said


def guarded_transport(
    policy: CallbackPolicy,
    resolver: Resolver | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> httpx.AsyncBaseTransport:
    """An httpx transport that connects only where ``policy`` allows (see
    :class:`convoq.netguard.GuardedBackend`); ``ssl_context``: default, httpx's (system
    CAs, certificates checked against the URL's host name)."""
    return _transport_over(GuardedBackend(policy, resolver), ssl_context)


class GuardedTransport(PoolTransport, httpx.AsyncBaseTransport, client=httpx, core=httpcore):
    """An httpx transport (httpx's documented custom-transport interface) over httpcore's
    connection pool built on ``backend``: see :class:`convoq.netguard.PoolTransport`."""


# How delivery transports are built (the guard check probes this very function).
_transport_over: Callable[
    [httpcore.AsyncNetworkBackend, ssl.SSLContext | None], httpx.AsyncBaseTransport
] = GuardedTransport


class _ProbeBackend(ProbeBackend, httpcore.AsyncNetworkBackend):
    """Raises ProbeReached when asked to connect (see :class:`~convoq.netguard.GuardCheck`)."""


async def _probe() -> None:
    transport = _transport_over(_ProbeBackend(), None)
    async with httpx.AsyncClient(transport=transport, trust_env=False) as client:
        await client.get(PROBE_URL)


GUARD = GuardCheck("webhook delivery", _probe)
"""Checked before a process's first delivery: a transport that does not route through
the guarded backend sends nothing."""


def backoff_s(retries: int, base_s: float, cap_s: float = 600.0) -> float:
    """Exponential backoff: base, 2*base, 4*base ... capped."""
    return float(min(cap_s, base_s * (2**retries)))

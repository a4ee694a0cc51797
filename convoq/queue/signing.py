"""Signed webhooks, the contract between the workers that send them and whoever receives
them: the payload and its signature.

A finished turn with a ``callback_url`` gets one POST of a small JSON body (status, text,
error; never attachment bytes) signed like Stripe's webhooks::

    X-Convoq-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of f"{t}.{body}">

The timestamp is part of what is signed, so a receiver that checks it against its clock
(:func:`verify_signature`, 5 minutes by default) refuses replays. Redirects are never
followed (a redirect could send the signed body elsewhere) and response bodies are not
read (:mod:`convoq.worker.webhooks` delivers).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

SIGNATURE_HEADER = "X-Convoq-Signature"
MAX_TEXT_CHARS = 64 * 1024


def sign(secret: str, body: bytes, *, timestamp: int | None = None) -> str:
    """The ``X-Convoq-Signature`` header value for ``body``."""
    ts = int(time.time()) if timestamp is None else timestamp
    return f"t={ts},v1={_digest(secret, ts, body)}"


def verify_signature(secret: str, header: str, body: bytes | str, tolerance_s: int = 300) -> bool:
    """Check a webhook's ``X-Convoq-Signature`` header against its raw body.

    Args:
        secret: the shared secret (``CONVOQ_WEBHOOK_SECRET`` of the workers).
        header: the header value, ``t=<ts>,v1=<hex>`` (several ``v1`` are allowed while a
            secret is rotated).
        body: the raw request body, exactly as received.
        tolerance_s: how old (or how far in the future) the timestamp may be.

    Returns:
        True only if one ``v1`` matches and the timestamp is within ``tolerance_s``.
    """
    raw = body.encode() if isinstance(body, str) else body
    timestamp: int | None = None
    candidates: list[str] = []
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        if key == "t" and value.isdigit():
            timestamp = int(value)
        elif key == "v1":
            candidates.append(value)
    if timestamp is None or not candidates:
        return False
    if abs(time.time() - timestamp) > tolerance_s:
        return False
    expected = _digest(secret, timestamp, raw)
    return any(hmac.compare_digest(expected, c) for c in candidates)


def _digest(secret: str, timestamp: int, body: bytes) -> str:
    message = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def build_payload(
    *,
    conversation_id: str,
    turn_id: str,
    status: str,
    agent: str,
    text: str | None,
    error: dict[str, Any] | None,
    finished_ms: int | None,
    usage: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    output: Any = None,
    metadata: dict[str, Any] | None = None,
    decisions: dict[str, dict[str, Any]] | None = None,
    children: list[Any] | None = None,
    parent: dict[str, Any] | None = None,
    handed_from: str | None = None,
    texting: dict[str, Any] | None = None,
) -> bytes:
    """The JSON body of a callback: small and bounded (long text is cut and flagged).
    ``usage``: the turn's token counts (from its result), ``finish_reason`` its final
    model call's; ``metadata`` as submitted (bounded at submit); ``decisions``: the
    approval decisions by call id (who, when, why, or expired); ``children``: a parent's
    child turns (call id, agent, ids, status, usage), ``parent``: a child's parent call;
    ``handed_from``: the agent a turn handed to ``agent`` was submitted for;
    ``texting``: what double texting did to the turn (``stopped_by``: the turn that
    interrupted or rolled it back; ``merged``: the turns whose messages joined it), its
    keys only when set."""
    shown = text or ""
    payload = {
        "type": "turn.finished",
        "conversation_id": conversation_id,
        "turn_id": turn_id,
        "status": status,
        "agent": agent,
        "text": shown[:MAX_TEXT_CHARS],
        "text_truncated": len(shown) > MAX_TEXT_CHARS,
        "error": _bounded_error(error),
        "finished_ms": finished_ms,
        "usage": _bounded_usage(usage),
        "finish_reason": str(finish_reason)[:64] if finish_reason is not None else None,
        **_bounded_output(output),
        "metadata": metadata or {},
        "decisions": decisions or {},
        "children": [
            _bounded_child(c) for c in (children or [])[:MAX_CHILDREN] if isinstance(c, dict)
        ],
        "parent": _bounded_child(parent) if isinstance(parent, dict) else None,
        "handed_from": handed_from[:256] if handed_from is not None else None,
        **(texting or {}),
    }
    return json.dumps(payload, separators=(",", ":")).encode()


def _bounded_output(output: Any) -> dict[str, Any]:
    """The validated output of a turn with an output type, as bounded as its text: one
    larger than MAX_TEXT_CHARS as JSON is left out and flagged (the turn record has it)."""
    if output is None:
        return {}
    size = len(json.dumps(output, separators=(",", ":")))
    if size > MAX_TEXT_CHARS:
        return {"output": None, "output_truncated": True}
    return {"output": output, "output_truncated": False}


MAX_CHILDREN = 64
"""The most child turns a callback lists (a step makes at most CONVOQ_SUBAGENT_MAX_FANOUT)."""
_CHILD_FIELDS = ("call_id", "agent", "conversation_id", "turn_id", "status")


def _bounded_child(entry: dict[str, Any]) -> dict[str, Any]:
    """A child turn (or a parent call) with its ids cut to 256 characters."""
    shown: dict[str, Any] = {k: str(entry[k])[:256] for k in _CHILD_FIELDS if k in entry}
    if "usage" in entry:
        shown["usage"] = _bounded_usage(entry["usage"])
    if isinstance(entry.get("depth"), int):
        shown["depth"] = entry["depth"]
    return shown


def _bounded_usage(usage: dict[str, Any] | None) -> dict[str, int] | None:
    if not isinstance(usage, dict):
        return None
    return {str(k)[:64]: v for k, v in list(usage.items())[:16] if isinstance(v, int)}


def _bounded_error(error: dict[str, Any] | None) -> dict[str, Any] | None:
    if error is None:
        return None
    bounded = {"type": error.get("type"), "message": str(error.get("message", ""))[:2000]}
    details = error.get("details")
    if error.get("type") == "GuardrailTripped" and isinstance(details, dict):
        # Which guardrail blocked the turn and why (its reason is bounded already).
        bounded |= {k: str(details.get(k, ""))[:2000] for k in ("guardrail", "kind", "reason")}
    return bounded

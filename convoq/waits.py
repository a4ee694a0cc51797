"""Tool calls that wait for the world: a deferred result, or a named signal.

A tool raises :class:`CallDeferred` when its result will come later from outside (a job
another system runs, a webhook), or :class:`WaitForSignal` when the turn must wait for
something to happen in its conversation (a payment confirmed). The turn then parks like a
turn waiting for an approval: it holds no worker slot, its conversation stays reserved
(later turns wait behind it), and it resumes on any worker once every waiting call has its
answer: ``complete_call`` supplies a deferred call's result, ``signal`` delivers a signal.
What the model reads as the call's result is that result (a str as it is, anything else as
JSON) or the signal's payload. A wait has a deadline (``timeout_s``, else the agent's
approval expiry): once it passes, the turn resumes and the model reads an error for each
call still waiting. These are not errors of convoq's tree (:mod:`convoq.errors`): they
ask the turn loop to park, and a tool should let them pass.
"""

from __future__ import annotations

import json
import math
from typing import Any

from convoq.errors import ConvoqError
from convoq.ids import is_label
from convoq.messages import Decision, ToolCall
from convoq.turn_state import TurnState, Wait

__all__ = ["CallDeferred", "WaitForSignal", "WaitRequest"]

MAX_SIGNAL_NAME_CHARS = 128
"""The longest signal name (any characters but control characters)."""

MAX_WAIT_METADATA_BYTES = 4096
"""The largest ``metadata`` a wait carries (its compact JSON, in bytes)."""

MAX_RESULT_BYTES = 1024 * 1024
"""The largest result or signal payload (its compact JSON, in bytes)."""


class WaitRequest(Exception):
    """Raised by a tool: its call waits for the world (``wait`` says for what)."""

    def __init__(self, wait: Wait) -> None:
        super().__init__(f"the call waits for {wait.on}")
        self.wait = wait


class CallDeferred(WaitRequest):
    """The call's result comes later from outside: ``complete_call`` supplies it.

    Args:
        timeout_s: how long the result may take (None: the agent's approval expiry).
        metadata: a JSON object shown to operators with the waiting call (a job id).
    """

    def __init__(
        self, *, timeout_s: float | None = None, metadata: dict[str, Any] | None = None
    ) -> None:
        super().__init__(Wait(on="result", timeout_s=_timeout(timeout_s), metadata=_meta(metadata)))


class WaitForSignal(WaitRequest):
    """The call waits for the signal ``name`` of its conversation (``signal``); the
    model reads the signal's payload as the call's result. A signal sent before the wait
    was kept for it: the turn goes on at once.

    Args:
        name: the signal's name (1 to 128 characters, no control characters).
        timeout_s: how long to wait (None: the agent's approval expiry).
        metadata: a JSON object shown to operators with the waiting call.
    """

    def __init__(
        self, name: str, *, timeout_s: float | None = None, metadata: dict[str, Any] | None = None
    ) -> None:
        wait = Wait(
            on="signal", name=check_signal_name(name), timeout_s=_timeout(timeout_s),
            metadata=_meta(metadata),
        )  # fmt: skip
        super().__init__(wait)


def check_signal_name(name: object) -> str:
    """``name`` when it may name a signal; else ConvoqError naming the rule."""
    if not is_label(name, MAX_SIGNAL_NAME_CHARS):
        raise ConvoqError(
            f"a signal name is a str of 1 to {MAX_SIGNAL_NAME_CHARS} characters without"
            " control characters",
            field="name",
        )
    return name


def result_text(value: Any, what: str = "result") -> str:
    """What the model reads for a supplied ``value``: a str as it is, else compact JSON
    (ConvoqError when it is not JSON-safe or over MAX_RESULT_BYTES)."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConvoqError(f"the {what} must be JSON-safe: {exc}", field=what) from exc
    if len(text.encode("utf-8")) > MAX_RESULT_BYTES:
        raise ConvoqError(f"the {what} is over {MAX_RESULT_BYTES} bytes", field=what)
    return text


def supplied_text(wait: Wait, decision: Decision) -> tuple[str, bool]:
    """What the model reads for a call whose wait ended with ``decision``, and whether it
    is an error: the result or payload; or, past the deadline, an error saying so."""
    if decision.expired:
        if wait.on == "signal":
            return (
                f"Error: the signal {wait.name!r} did not arrive before the wait's deadline.",
                True,
            )
        return "Error: no result for this tool call arrived before its deadline.", True
    return decision.result or "", decision.is_error


def wait_ttl_ms(state: TurnState, default_ms: int) -> int:
    """How long the parked turn waits: the shortest ``timeout_s`` of its world waits, or
    ``default_ms`` (the approval expiry) when some call waits for a person, a child turn
    or has no timeout of its own."""
    waits = [state.waits.get(call.id) for call in state.undecided]
    timeouts = [w.timeout_s for w in waits if w is not None and w.timeout_s is not None]
    shortest = min((math.ceil(t * 1000) for t in timeouts), default=default_ms)
    if any(w is None or w.timeout_s is None for w in waits):
        shortest = min(shortest, default_ms)
    return max(1, shortest)


def _timeout(value: float | None) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConvoqError("timeout_s must be a positive number of seconds", field="timeout_s")
    return float(value)


def _meta(value: dict[str, Any] | None) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConvoqError("metadata must be a JSON object (a dict)", field="metadata")
    if len(result_text(value, "metadata").encode("utf-8")) > MAX_WAIT_METADATA_BYTES:
        raise ConvoqError(
            f"metadata is over {MAX_WAIT_METADATA_BYTES} bytes of JSON", field="metadata"
        )
    return value


def wait_data(call: ToolCall, wait: Wait) -> dict[str, Any]:
    """The ``deferred`` event's data: the call and what it waits for."""
    return {
        "call_id": call.id, "name": call.name, "on": wait.on, "signal": wait.name,
        "timeout_s": wait.timeout_s, "metadata": wait.metadata,
    }  # fmt: skip

"""What a finished turn (succeeded, failed or cancelled) is owed: its finished hook (the
in-process callback, the webhook), whoever ended it: the runner, a script on the way to
the next turn, or the sweeper; and the error data a failed turn stores."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from convoq.errors import ConvoqError
from convoq.observe import metrics
from convoq.redis.roles import TurnReader

log = logging.getLogger("convoq.worker")

# Called after a turn finished (succeeded, failed or cancelled) with (cid, tid, options).
FinishedHook = Callable[[str, str, dict[str, Any]], Awaitable[None]]


async def no_hook(_cid: str, _tid: str, _options: dict[str, Any]) -> None:
    """The finished hook of a runner that has none."""
    return None


async def after_turn(
    protocol: TurnReader,
    hook: FinishedHook,
    cid: str,
    tid: str,
    options: dict[str, Any] | None = None,
) -> None:
    """Run ``hook`` for a finished turn. ``options`` None: read from the turn's record (a
    turn a script ended on its own). A failure is logged, never raised: a lost webhook
    must not stop the conversation."""
    try:
        if options is None:
            record = await protocol.get_turn(cid, tid)
            options = record.options
            metrics.turn_finished(record.agent, record.status)
        await hook(cid, tid, options)
    except Exception:
        log.exception("after-turn hook for %s/%s failed", cid, tid)


def error_data(exc: BaseException) -> dict[str, Any]:
    """The ``{type, message, details}`` stored for a failed turn."""
    if isinstance(exc, ConvoqError):
        return exc.to_data()
    return {"type": type(exc).__name__, "message": str(exc) or type(exc).__name__, "details": {}}

"""Scheduled turns on the command line: ``convoq submit ... --delay 30s`` / ``--at <ISO
8601>`` (:func:`schedule_asks`) and ``convoq scheduled CONVERSATION_ID`` (the turns still
waiting for their time; ``convoq cancel`` cancels one)."""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from convoq.cli._render import console, err_console
from convoq.client import Client
from convoq.errors import InvalidScheduleError
from convoq.redis._due import check_due

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")

DelayOption = Annotated[
    str | None,
    typer.Option(help="Schedule the turn this long from now: 30s, 5m, 1h30m, 2d, or seconds."),
]
AtOption = Annotated[
    str | None,
    typer.Option(
        help="Schedule the turn at this instant: ISO 8601 with a UTC offset (with --delay:"
        " the later of the two)."
    ),
]


def parse_delay(raw: str) -> float:
    """Seconds of ``30s``, ``5m``, ``1h30m``, ``250ms``, ``2d`` or a plain number.

    Raises:
        InvalidScheduleError: anything else.
    """
    text = raw.strip().lower()
    try:
        return float(text)
    except ValueError:
        pass
    if not text or _DURATION.sub("", text):
        raise InvalidScheduleError(
            f"--delay {raw!r} is no duration: use 30s, 5m, 1h30m, 250ms, 2d or seconds",
            field="delay_s",
        )
    return sum(float(n) * _UNITS[unit] for n, unit in _DURATION.findall(text))


def parse_at(raw: str) -> datetime:
    """The instant of an ISO 8601 time with a UTC offset (``Z`` or ``+02:00``).

    Raises:
        InvalidScheduleError: not ISO 8601, or without an offset.
    """
    try:
        at = datetime.fromisoformat(raw.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidScheduleError(
            f"--at {raw!r} is no ISO 8601 time, e.g. 2030-01-31T09:00:00+01:00",
            field="not_before",
        ) from None
    if at.tzinfo is None:
        raise InvalidScheduleError(
            f"--at {raw!r} has no UTC offset: add Z or +HH:MM, so its instant is unambiguous",
            field="not_before",
        )
    return at


def schedule_asks(delay: str | None, at: str | None) -> dict[str, Any]:
    """The ``submit`` keywords of ``--delay`` / ``--at`` (none when neither is given;
    both: the turn is due at the later of the two)."""
    asks: dict[str, Any] = {}
    if delay is not None:
        asks["delay_s"] = parse_delay(delay)
    if at is not None:
        asks["not_before"] = parse_at(at)
    check_due(asks.get("not_before"), asks.get("delay_s"))  # a usage error, before connecting
    return asks


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def register(app: typer.Typer, connected: Callable[[], AbstractContextManager[Client]]) -> None:
    """Add ``convoq scheduled`` to ``app``; ``connected()`` opens a client."""

    @app.command("scheduled")
    def scheduled_command(
        conversation_id: str,
        limit: Annotated[int, typer.Option(help="List at most this many.")] = 100,
    ) -> None:
        """List a conversation's scheduled turns still waiting for their time, earliest
        first: turn id, due time (UTC), agent, message (cancel one with convoq cancel)."""
        with connected() as client:
            waiting = client.scheduled(conversation_id, limit=limit)
        if not waiting:
            err_console.print(f"no scheduled turn waits in {conversation_id}")
        for turn in waiting:
            text = turn.record.input.text.replace("\n", " ")[:60]
            console.print(f"{turn.turn_id}  {_when(turn.due_ms)}  {turn.record.agent}  {text}")

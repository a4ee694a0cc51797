"""When a scheduled turn is due: :class:`Due` and :func:`check_due`, the one check of
``not_before`` / ``delay_s`` that every entry point (client, gateway, CLI, ``ctx.schedule``)
runs before anything is stored. Pure: no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from convoq.errors import InvalidScheduleError

MAX_DELAY_S = 366 * 24 * 3600
"""The longest ``delay_s`` a scheduled turn may wait (a year and a day)."""


@dataclass(frozen=True)
class Due:
    """When a scheduled turn is due: not before ``at_ms`` (ms since the epoch) and at
    least ``delay_ms`` after the Redis server's clock at the moment it is scheduled (the
    later of the two; either may be None, not both)."""

    at_ms: int | None = None
    delay_ms: int | None = None


def check_due(not_before: object, delay_s: object) -> Due | None:
    """When a scheduled turn is due: not before ``not_before`` (a timezone-aware
    datetime) and at least ``delay_s`` seconds (0 to MAX_DELAY_S) after Redis's clock
    when it is stored; both given, the later of the two. None for neither (the turn is
    queued at once).

    Raises:
        InvalidScheduleError: a naive datetime, a delay that is no finite number in
            range (nothing is queued).
    """
    if not_before is None and delay_s is None:
        return None
    at_ms = None if not_before is None else _instant_ms(not_before)
    delay_ms = None if delay_s is None else _delay_ms(delay_s)
    return Due(at_ms=at_ms, delay_ms=delay_ms)


def _delay_ms(delay_s: object) -> int:
    if isinstance(delay_s, bool) or not isinstance(delay_s, (int, float)):
        raise InvalidScheduleError(
            f"delay_s must be a number of seconds, not {type(delay_s).__name__}",
            field="delay_s",
        )
    if not math.isfinite(delay_s) or not 0 <= delay_s <= MAX_DELAY_S:
        raise InvalidScheduleError(
            f"delay_s must be between 0 and {MAX_DELAY_S} seconds, not {delay_s!r}",
            field="delay_s",
        )
    return math.ceil(delay_s * 1000)


def _instant_ms(not_before: object) -> int:
    if not isinstance(not_before, datetime):
        raise InvalidScheduleError(
            f"not_before must be a datetime, not {type(not_before).__name__}",
            field="not_before",
        )
    if not_before.tzinfo is None or not_before.utcoffset() is None:
        raise InvalidScheduleError(
            f"not_before {not_before.isoformat()} has no timezone: give an aware datetime"
            " (datetime.now(timezone.utc) + timedelta(...)), so its instant is unambiguous",
            field="not_before",
        )
    # A time already past (even before 1970) is due at once.
    return max(0, math.ceil(not_before.timestamp() * 1000))

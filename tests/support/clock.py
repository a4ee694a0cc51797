"""A clock the test moves: what convoq's in-process expiries read (parked turns'
reservations, continuation expiry, spent continuation tokens) jumps forward on
:meth:`TestClock.advance`, so a test expires them when it means to, never by racing a
short lifetime. Redis keeps its own clock: there a test ends a lifetime by deleting the
key whose PX it is."""

from __future__ import annotations

import time
from typing import Any

import pytest

from convoq.memory import _reservations


class TestClock:
    """The ``time`` module as ``_reservations`` sees it, ``offset_s`` ahead."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self) -> None:
        self.offset_s = 0.0

    def advance(self, seconds: float) -> None:
        self.offset_s += seconds

    def monotonic(self) -> float:
        return time.monotonic() + self.offset_s

    def time_ns(self) -> int:
        return time.time_ns() + int(self.offset_s * 1_000_000_000)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)  # everything else as the real module has it


def install_clock(monkeypatch: pytest.MonkeyPatch) -> TestClock:
    """Put a :class:`TestClock` where convoq's in-process expiries read the time (the
    ``clock`` fixture of conftest.py)."""
    moved = TestClock()
    monkeypatch.setattr(_reservations, "time", moved)
    return moved

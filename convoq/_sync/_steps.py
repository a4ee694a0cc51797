"""Sans-I/O steps, driven by a sync or an async performer (see :mod:`convoq._sync`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import TypeVar

T = TypeVar("T")
C = TypeVar("C")
R = TypeVar("R")


def drive(steps: Generator[C, R, T], perform: Callable[[C], R]) -> T:
    """Run sans-I/O ``steps`` (a generator that yields requests and receives their
    replies) with a blocking ``perform``: the sync twin of :func:`adrive`."""
    try:
        request = next(steps)
        while True:
            request = steps.send(perform(request))
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]


async def adrive(steps: Generator[C, R, T], perform: Callable[[C], Awaitable[R]]) -> T:
    """Run sans-I/O ``steps`` with an async ``perform``."""
    try:
        request = next(steps)
        while True:
            request = steps.send(await perform(request))
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]

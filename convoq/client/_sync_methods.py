"""The blocking flavour of the client, generated from the async one.

A sync wrapper (:class:`~convoq.client.Client`, :class:`~convoq.client.TurnHandle`) keeps
its async twin in ``self._async``. Each of its methods is ``blocking(AsyncTwin.method)``:
the same parameters and docstring, run to the end on convoq's one loop thread
(:func:`convoq._sync.run_sync`), so connections and ``on_done`` watchers live on that loop
for as long as the wrapper does. One implementation per method; one line per sync method.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from convoq._sync import run_sync

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R")

AsyncMethod = Callable[Concatenate[Any, P], Coroutine[Any, Any, T]]


def blocking(method: AsyncMethod[P, T]) -> Callable[Concatenate[Any, P], T]:
    """A sync method that runs ``method`` on ``self._async`` and returns its result."""

    @functools.wraps(method)
    def call(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return run_sync(method(self._async, *args, **kwargs))

    return call


def blocking_as(
    method: AsyncMethod[P, T], wrap: Callable[[T], R]
) -> Callable[Concatenate[Any, P], R]:
    """As :func:`blocking`, its result passed through ``wrap`` (an async handle becomes
    a sync one)."""

    @functools.wraps(method)
    def call(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return wrap(run_sync(method(self._async, *args, **kwargs)))

    # What help() and inspect show: the wrapped type, not the async one.
    shown = inspect.signature(method).replace(return_annotation=getattr(wrap, "__name__", ""))
    setattr(call, "__signature__", shown)  # noqa: B010  (functions have no typed slot for it)
    return call


def signature_of(
    init: Callable[Concatenate[Any, P], None],
) -> Callable[[Callable[..., None]], Callable[Concatenate[Any, P], None]]:
    """Give a wrapper's ``__init__`` the parameters of its async twin's ``__init__``
    (for type checkers and ``inspect.signature``); it passes them on unchanged."""

    def apply(wrapper: Callable[..., None]) -> Callable[Concatenate[Any, P], None]:
        return functools.wraps(init)(wrapper)

    return apply

"""Keyword arguments that were renamed: the old name still works, with a
``DeprecationWarning`` that names the new one.

The check runs in the caller's thread, before the call: a sync method's coroutine runs on
convoq's loop thread, where a warning would point at convoq instead of the caller's line
(and be hidden by Python's default filters).
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast

from convoq.errors import ConvoqError

F = TypeVar("F", bound=Callable[..., Any])


def renamed_keyword(old: str, new: str) -> Callable[[F], F]:
    """Take ``old=`` as the deprecated name of ``new=``: warn, then pass it on as ``new``.

    Giving both (neither None) is a ConvoqError: which one was meant is not known.
    """

    def apply(function: F) -> F:
        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def call_async(*args: Any, **kwargs: Any) -> Any:
                return await function(*args, **_moved(kwargs, old, new))

            return cast(F, call_async)

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **_moved(kwargs, old, new))

        return cast(F, call)

    return apply


def _moved(kwargs: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    if old not in kwargs:
        return kwargs
    value = kwargs.pop(old)
    if value is None:
        return kwargs
    if kwargs.get(new) is not None:
        raise ConvoqError(f"pass {new}= only: {old}= is its deprecated name, not a second option")
    # stacklevel 3: past this function and the wrapper, at the caller's line.
    warnings.warn(
        f"{old}= is deprecated; pass {new}= (it takes the same values)",
        DeprecationWarning,
        stacklevel=3,
    )
    return {**kwargs, new: value}

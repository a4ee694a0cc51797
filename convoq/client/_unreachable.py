"""The client's boundary for a Redis that cannot be reached: redis-py's connection and
timeout errors (and a cluster that cannot serve a slot now) leave a public client or
handle method as :class:`~convoq.errors.RedisUnavailableError`, naming the Redis (its URL
without the password, or the embedded server's directory) and what to do.

Each public coroutine of :class:`~convoq.client.AsyncClient` and
:class:`~convoq.client.AsyncTurnHandle` is wrapped with :func:`mapped` (async generators
with :func:`mapped_stream`); the sync twins run those coroutines, so they raise the same.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from convoq.errors import RedisUnavailableError
from convoq.redis._base import REDIS_UNAVAILABLE

P = ParamSpec("P")
T = TypeVar("T")


class NamesRedis(Protocol):
    """A client that can say which Redis it uses."""

    def redis_named(self) -> str: ...


S = TypeVar("S")


def _named(owner: Any) -> str:
    """Which Redis ``owner`` (a client, or a handle with its ``_client``) uses."""
    client: NamesRedis = getattr(owner, "_client", owner)
    return client.redis_named()


def unavailable(where: str, exc: BaseException) -> RedisUnavailableError:
    """The error for ``exc`` (a connection or timeout error) on the Redis ``where``."""
    reason = " ".join(str(exc).split()).rstrip(".") or type(exc).__name__
    return RedisUnavailableError(
        f"Redis does not answer at {where} ({reason[:200]}); start it, or point"
        " CONVOQ_REDIS_URL (redis_url=) at one that runs, then try again",
        redis=where,
        reason=type(exc).__name__,
    )


def mapped(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """``method`` raising RedisUnavailableError where Redis cannot be reached."""

    @functools.wraps(method)
    async def call(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await method(self, *args, **kwargs)
        except REDIS_UNAVAILABLE as exc:
            raise unavailable(_named(self), exc) from exc

    return call


def mapped_stream(
    method: Callable[Concatenate[S, P], AsyncIterator[T]],
) -> Callable[Concatenate[S, P], AsyncIterator[T]]:
    """:func:`mapped` for an async generator method."""

    @functools.wraps(method)
    async def stream(self: S, /, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
        items = method(self, *args, **kwargs)
        try:
            async for item in items:
                yield item
        except REDIS_UNAVAILABLE as exc:
            raise unavailable(_named(self), exc) from exc
        finally:
            # Closed with this generator: a reader that stops early leaves no read open.
            close = getattr(items, "aclose", None)
            if close is not None:
                await close()

    return stream

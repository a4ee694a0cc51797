"""redis-py's retry with a time budget: a call that failed (a dropped connection, a reply
that did not come within the socket timeout) is sent again on a new connection, at most
``retries`` times *and* only while its budget since the first send lasts.

The count alone bounds nothing in time: with a socket timeout of 10 s, five resends on a
network that swallows packets would take a minute. A Redis that restarts refuses at once,
so its resends fit in any budget; a half-open connection costs one socket timeout, and the
resend on a fresh connection then goes through. Only what is still failing when the budget
is spent raises (see :mod:`convoq._connection_bounds`).

Both flavours override only ``call_with_retry``, redis-py's public entry point, and hand
its failure callback on with a check added after it (whatever else a redis-py release
passes is passed on as it came).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

T = TypeVar("T")
# Resends after a failure, and their pauses: enough to ride out a Redis restart.
RETRIES = 5


def _backoff() -> ExponentialWithJitterBackoff:
    return ExponentialWithJitterBackoff(base=0.05, cap=1.0)


class BudgetedRetry(AsyncRetry):
    """The async flavour; ``budget_s`` None: the count alone bounds the resends."""

    def __init__(self, budget_s: float | None) -> None:
        super().__init__(_backoff(), RETRIES)
        self.budget_s = budget_s

    async def call_with_retry(
        self, do: Callable[[], Awaitable[T]], fail: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> T:
        budget, started = self.budget_s, time.monotonic()

        async def failed(error: Exception, *count: int) -> None:
            await fail(error, *count)
            if budget is not None and time.monotonic() - started >= budget:
                raise error

        return await super().call_with_retry(do, failed, *args, **kwargs)


class BudgetedSyncRetry(Retry):
    """The sync flavour of :class:`BudgetedRetry`."""

    def __init__(self, budget_s: float | None) -> None:
        super().__init__(_backoff(), RETRIES)
        self.budget_s = budget_s

    def call_with_retry(
        self, do: Callable[[], T], fail: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> T:
        budget, started = self.budget_s, time.monotonic()

        def failed(error: Exception, *count: int) -> None:
            fail(error, *count)
            if budget is not None and time.monotonic() - started >= budget:
                raise error

        return super().call_with_retry(do, failed, *args, **kwargs)

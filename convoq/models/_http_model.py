"""What every model over HTTP shares: options, the retry loop, deadlines, HTTP clients.

:class:`HTTPModel` is the template: a wire format subclasses it and says only where to
POST (:meth:`HTTPModel._url`), with which auth headers (:meth:`HTTPModel._auth_headers`),
what body (:meth:`HTTPModel._build_body`) and how to read the answer
(:attr:`HTTPModel.codec`, or :meth:`HTTPModel._codec` when that depends on the request).
Requests are retried as the official OpenAI and Anthropic SDKs retry them (408, 409, 429,
5xx including Anthropic's 529 "overloaded", or whatever ``x-should-retry: true|false``
says; timeouts and dropped connections) with exponential backoff and jitter, honouring
``Retry-After`` / ``retry-after-ms``. Each attempt, and the call as a whole, has a
deadline (:mod:`convoq.models._http_attempt`).
"""

from __future__ import annotations

import asyncio
import random
import time
import weakref
from collections.abc import Mapping
from typing import Any, ClassVar, Self, TypedDict

import httpx

from convoq import defaults
from convoq.errors import ModelError, ModelTimeoutError
from convoq.messages import Message
from convoq.models._http_attempt import Attempt, RetryableError, WireCodec, run_attempt
from convoq.models.base import ModelRequest, TextDeltaHandler, retraction_of
from convoq.observe import metrics

MAX_BACKOFF = 8.0
DEFAULT_MAX_RESPONSE_BYTES = 16 * defaults.MiB
DEFAULT_ATTEMPT_TIMEOUT = 600.0
DEFAULT_TOTAL_TIMEOUT = 900.0


class HTTPOptions(TypedDict, total=False):
    """The options every model over HTTP takes (see :class:`HTTPModel`)."""

    timeout: float
    attempt_timeout: float | None
    total_timeout: float | None
    max_retries: int
    extra_body: Mapping[str, Any] | None
    headers: Mapping[str, str] | None
    query: Mapping[str, str] | None
    http_client: httpx.AsyncClient | None
    retry_base_delay: float
    max_response_bytes: int


class HTTPModel:
    """A model behind one POST endpoint. The options every subclass takes:

    Args:
        timeout: seconds allowed for each of connect, write, pool wait and every read.
        attempt_timeout: seconds one attempt may take from start to last byte, however
            the server trickles (keep-alive comments do not extend it); None: no limit.
        total_timeout: seconds the whole call may take, retries and backoff included;
            None: no limit. ModelTimeoutError when either runs out.
        max_retries: further attempts after a retryable status (408, 409, 429, 5xx, or
            ``x-should-retry: true``), a timeout or a dropped connection.
        extra_body: keys merged into every request body (the request's own
            ``settings.extra_body`` still wins).
        headers: extra HTTP headers for every request (they win over the auth headers).
        query: query parameters for every request (e.g. Azure's ``api-version``).
        http_client: an ``httpx.AsyncClient`` to use; its owner closes it. Without one, a
            client per event loop is created on first use; :meth:`aclose` closes them.
        retry_base_delay: first backoff in seconds, doubled each retry (capped at 8 s).
        max_response_bytes: a non-streamed answer larger than this is refused (ModelError)
            instead of being read into memory whole.
    """

    codec: ClassVar[WireCodec]

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        timeout: float = 60.0,
        attempt_timeout: float | None = DEFAULT_ATTEMPT_TIMEOUT,
        total_timeout: float | None = DEFAULT_TOTAL_TIMEOUT,
        max_retries: int = 3,
        extra_body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        query: Mapping[str, str] | None = None,
        http_client: httpx.AsyncClient | None = None,
        retry_base_delay: float = 0.5,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if max_retries < 0:
            raise ModelError(f"max_retries must be 0 or more, not {max_retries}")
        for name, value in (("attempt_timeout", attempt_timeout), ("total_timeout", total_timeout)):
            if value is not None and not value > 0:
                raise ModelError(f"{name} must be a number of seconds > 0 or None, not {value}")
        self.name = model
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.timeout = httpx.Timeout(timeout)
        self.attempt_timeout = attempt_timeout
        self.total_timeout = total_timeout
        self.max_retries = max_retries
        self.retry_base_delay = retry_base_delay
        self.max_response_bytes = max_response_bytes
        self.extra_body = dict(extra_body or {})
        self.headers = dict(headers or {})
        self.query = dict(query or {})
        self._http_client = http_client
        # httpx clients belong to the loop they first ran on: one per loop, dropped with it.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient]
        self._clients = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model!r}, base_url={self.base_url!r})"

    # What a wire format says.

    def _url(self) -> str:
        raise NotImplementedError

    def _auth_headers(self) -> dict[str, str]:
        """The auth headers; ModelError (before any I/O) when a required key is missing."""
        raise NotImplementedError

    def _codec(self, request: ModelRequest) -> WireCodec:
        return self.codec

    def _build_body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        """The JSON body, ``extra_body`` merged in; ModelError for what the API cannot take."""
        raise NotImplementedError

    # The shared call.

    async def request(
        self, request: ModelRequest, *, on_text_delta: TextDeltaHandler | None = None
    ) -> Message:
        """Send ``request``; stream text to ``on_text_delta`` when given.

        Raises:
            ModelHTTPError: the server answered an error status (after retries when the
                status is retryable).
            ModelTimeoutError: an attempt or the whole call ran past its deadline.
            TruncatedAnswerError: the model hit its token limit before answering anything.
            ModelError: a missing API key, settings the API cannot take, a transport
                failure after retries, or an answer that cannot be used.
        """
        stream = on_text_delta is not None
        body = self._build_body(request, stream=stream)
        codec = self._codec(request)
        headers = {"Accept": "text/event-stream" if stream else "application/json"}
        headers.update(self._auth_headers())
        headers.update(self.headers)
        started = time.monotonic()
        total_end = None if self.total_timeout is None else started + self.total_timeout
        retract = retraction_of(on_text_delta)
        attempt = 0
        while True:
            an_attempt = self._attempt(body, headers, total_end, codec)
            an_attempt.retractable = retract is not None
            try:
                return await run_attempt(an_attempt, on_text_delta)
            except RetryableError as failure:
                delay = self._delay(attempt, failure.delay)
                out_of_time = total_end is not None and time.monotonic() + delay >= total_end
                if attempt >= self.max_retries or out_of_time:
                    raise failure.error from failure.__cause__
                metrics.model_retry(self.model, metrics.error_status(failure.error))
                if an_attempt.delivered and retract is not None:
                    await retract()  # readers drop this call's text: it streams again
                await asyncio.sleep(delay)
                attempt += 1

    def _attempt(
        self,
        body: dict[str, Any],
        headers: dict[str, str],
        total_end: float | None,
        codec: WireCodec,
    ) -> Attempt:
        now = time.monotonic()
        ends: list[tuple[float, str]] = []
        if self.attempt_timeout is not None:
            ends.append((now + self.attempt_timeout, f"attempt_timeout={self.attempt_timeout:g} s"))
        if total_end is not None:
            ends.append((total_end, f"total_timeout={self.total_timeout:g} s"))
        stop_at, why = min(ends) if ends else (float("inf"), "no deadline")
        if stop_at <= now:
            raise ModelTimeoutError(
                f"the model call ran out of time before another attempt ({why})", deadline=why
            )
        return Attempt(
            client=self._client(), url=self._url(), body=body, headers=headers,
            timeout=self.timeout, stop_at=stop_at, why=why,
            max_response_bytes=self.max_response_bytes, codec=codec, params=self.query,
        )  # fmt: skip

    def _delay(self, attempt: int, asked: float | None) -> float:
        if asked is not None:
            return asked
        backoff = min(MAX_BACKOFF, self.retry_base_delay * 2.0**attempt)
        return backoff * random.uniform(0.5, 1.0)  # jitter: retries of many turns spread out

    def _client(self) -> httpx.AsyncClient:
        if self._http_client is not None:
            return self._http_client
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            client = httpx.AsyncClient(timeout=self.timeout)
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        """Close the HTTP clients this model created (not one passed as ``http_client``).

        The model stays usable: a later request opens a new client.
        """
        current = asyncio.get_running_loop()
        clients = list(self._clients.items())
        self._clients.clear()
        for loop, client in clients:
            if loop is current:
                await client.aclose()
            elif loop.is_running():  # e.g. the sync bridge's loop thread
                future = asyncio.run_coroutine_threadsafe(client.aclose(), loop)
                await asyncio.wrap_future(future)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def key_headers(key: str | None, header: str) -> dict[str, str]:
    """``Authorization: Bearer KEY`` when ``header`` is Authorization, else ``header: KEY``
    (Azure's ``api-key``, Anthropic's ``x-api-key``); nothing without a key."""
    if not key:
        return {}
    if header.lower() == "authorization":
        return {"Authorization": f"Bearer {key}"}
    return {header: key}

"""One attempt of a model call over httpx, bounded by a deadline, for every wire format.

:class:`convoq.models._http_model.HTTPModel` decides on retries; this module runs a single
attempt and says whether a failure is worth another one (:class:`RetryableError`). What
the bytes mean is the wire format's business (:class:`WireCodec`): a whole JSON answer is
parsed at once, a server-sent-event stream is fed line by line to a :class:`StreamDecoder`.

The deadline is kept two ways, so neither has to be trusted alone: the attempt runs under
``asyncio.timeout`` (which cancels it), and every httpx timeout is cut to the time left
and checked again after each piece of the answer arrives. A server that sends ``:
keep-alive`` comments forever, or nothing at all, is given up on at the deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import httpx

from convoq.errors import ModelError, ModelHTTPError, ModelTimeoutError
from convoq.messages import Message
from convoq.models._sse import lines as sse_lines
from convoq.models.base import TextDeltaHandler

MAX_RETRY_AFTER = 60.0
MAX_ERROR_BODY_BYTES = 64 * 1024


class RetryableError(Exception):
    """One failed attempt worth another try; ``error`` is raised if none is left."""

    def __init__(self, error: ModelError, delay: float | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.delay = delay


class StreamDecoder(Protocol):
    """Turns the lines of one event stream into one assistant message."""

    def feed(self, line: str) -> str | None:
        """Take one line (without its newline); return the text delta it carries, if any."""
        ...

    def finish(self) -> Message:
        """The assembled message, once the stream has ended; :func:`cut_off` when it
        ended before its end marker, else ModelError for an answer that cannot be used."""
        ...


def cut_off(end_marker: str) -> RetryableError:
    """A stream whose body ended before ``end_marker``: the connection dropped (closed,
    not reset, so the body just ended), worth another attempt unless text went out."""
    return RetryableError(
        ModelError(f"the model stream ended before {end_marker}; the answer may be cut off")
    )


@dataclass(frozen=True)
class WireCodec:
    """How one wire format reads an answer: ``parse`` a whole JSON body, or feed a
    ``stream()`` decoder (a new one per attempt) with the lines of an event stream."""

    parse: Callable[[bytes], Message]
    stream: Callable[[], StreamDecoder]


@dataclass
class Attempt:
    """One POST: where, what, and until when (``time.monotonic()``)."""

    client: httpx.AsyncClient
    url: str
    body: dict[str, Any]
    headers: dict[str, str]
    timeout: httpx.Timeout
    stop_at: float
    why: str  # which setting set the deadline, for the error message
    max_response_bytes: int
    codec: WireCodec
    params: dict[str, str] = field(default_factory=dict)
    answered: int | None = None  # the HTTP status, once the server has answered
    delivered: bool = False  # some text went out to the handler
    # The handler can take text back (retraction_of): a call whose text went out part way
    # may still be retried, after the model retracts it.
    retractable: bool = False

    def left(self) -> float:
        """Seconds left; ModelTimeoutError once none is."""
        left = self.stop_at - time.monotonic()
        if left <= 0:
            raise ModelTimeoutError(
                f"the model endpoint {self.url} did not finish answering within its deadline"
                f" ({self.why}); raise it or check the server",
                deadline=self.why,
            )
        return left

    def bounded_timeout(self) -> httpx.Timeout:
        left = self.left()
        t = self.timeout

        def cut(value: float | None) -> float | None:
            if value is None:
                return None if left == float("inf") else left
            return min(value, left)

        return httpx.Timeout(connect=cut(t.connect), read=cut(t.read), write=cut(t.write),
                             pool=cut(t.pool))  # fmt: skip


async def run_attempt(attempt: Attempt, on_text_delta: TextDeltaHandler | None) -> Message:
    """Send the request once. Raises RetryableError for what another attempt may fix (a
    retryable status, a transport failure or the deadline, unless text went out already)."""
    try:
        left = attempt.left()
        async with asyncio.timeout(None if left == float("inf") else left):
            return await _send(attempt, on_text_delta)
    except TimeoutError as exc:  # asyncio.timeout fired: the deadline passed mid-await
        error = ModelTimeoutError(
            f"the model endpoint {attempt.url} did not finish answering within its deadline"
            f" ({attempt.why}); raise it or check the server",
            deadline=attempt.why,
        )
        if attempt.delivered and not attempt.retractable:  # a retry would repeat text
            raise error from exc
        raise RetryableError(error) from exc
    except ModelTimeoutError as exc:
        if attempt.delivered and not attempt.retractable:
            raise
        raise RetryableError(exc) from exc


async def _send(attempt: Attempt, on_text_delta: TextDeltaHandler | None) -> Message:
    try:
        async with attempt.client.stream(
            "POST",
            attempt.url,
            json=attempt.body,
            headers=attempt.headers,
            params=attempt.params,
            timeout=attempt.bounded_timeout(),
        ) as response:
            attempt.answered = response.status_code
            await _check_status(response)
            if on_text_delta is None or not _is_event_stream(response):
                raw = await _read_bounded(response, attempt)
                message = attempt.codec.parse(raw)
                if on_text_delta is not None and message.text:
                    await on_text_delta(message.text)  # the server did not stream
                return message
            return await _read_stream(response, attempt, on_text_delta)
    except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
        error = _transport_error(exc, attempt)
        if attempt.delivered and not attempt.retractable:  # a retry would repeat text
            raise error from exc
        raise RetryableError(error) from exc
    except httpx.HTTPError as exc:
        raise _transport_error(exc, attempt) from exc


async def _chunks(response: httpx.Response, attempt: Attempt) -> AsyncIterator[bytes]:
    async for chunk in response.aiter_bytes():
        attempt.left()  # a trickle of bytes does not stretch the deadline
        yield chunk


async def _read_bounded(response: httpx.Response, attempt: Attempt) -> bytes:
    """The whole body, or ModelError once it grows past ``max_response_bytes``."""
    limit = attempt.max_response_bytes
    raw = bytearray()
    async for chunk in _chunks(response, attempt):
        raw += chunk
        if len(raw) > limit:
            raise ModelError(
                f"the model endpoint answered more than max_response_bytes={limit} bytes;"
                " raise max_response_bytes if such answers are expected",
                limit=limit,
            )
    return bytes(raw)


async def _read_stream(
    response: httpx.Response, attempt: Attempt, on_text_delta: TextDeltaHandler
) -> Message:
    decoder = attempt.codec.stream()
    try:
        # The event stream's own line ends (CR, LF, CRLF), not httpx's aiter_lines, which
        # also splits at U+2028 and the like: characters a JSON string may hold raw.
        async for line in sse_lines(response.aiter_bytes()):
            attempt.left()  # keep-alive comments must not keep the call open past its deadline
            text = decoder.feed(line)
            if text:
                attempt.delivered = True
                await on_text_delta(text)
        message = decoder.finish()
    except RetryableError as failure:  # "overloaded" in the stream, or the stream cut off
        if attempt.delivered and not attempt.retractable:  # a retry would repeat text
            raise failure.error from failure
        raise
    if not attempt.delivered and message.text:
        await on_text_delta(message.text)  # text no delta carried (an output tool's JSON)
    return message


async def _check_status(response: httpx.Response) -> None:
    status = response.status_code
    if status < 400:
        return
    # Only the start of an error body is kept: enough to say what went wrong.
    raw = b""
    async for chunk in response.aiter_bytes():
        raw += chunk
        if len(raw) >= MAX_ERROR_BODY_BYTES:
            break
    body = raw[:MAX_ERROR_BODY_BYTES].decode("utf-8", errors="replace")
    error = ModelHTTPError(
        f"the model endpoint answered HTTP {status} for {response.request.url}: {body[:500]}",
        status_code=status,
        body=body,
    )
    if should_retry(status, response.headers):
        raise RetryableError(error, retry_after(response.headers, cap=MAX_RETRY_AFTER))
    raise error


def _is_event_stream(response: httpx.Response) -> bool:
    # A server that ignores "stream": true answers plain JSON; that is read as one delta.
    return "json" not in response.headers.get("content-type", "")


def _transport_error(exc: httpx.HTTPError, attempt: Attempt) -> ModelError:
    if isinstance(exc, httpx.TimeoutException) and attempt.stop_at - time.monotonic() < 0.01:
        # The read timeout was cut to the deadline: it is the deadline that ran out.
        return ModelTimeoutError(
            f"the model endpoint {attempt.url} did not finish answering within its deadline"
            f" ({attempt.why}); raise it or check the server",
            deadline=attempt.why,
        )
    if isinstance(exc, httpx.TimeoutException):
        return ModelTimeoutError(
            f"the model endpoint {attempt.url} did not answer within {attempt.timeout.read} s"
            f" ({type(exc).__name__}); raise timeout=... or check the server",
            deadline="timeout",
        )
    if attempt.answered is not None:
        # The server was reached and answered: base_url is right, the answer broke off.
        return ModelError(
            f"the model endpoint {attempt.url} answered HTTP {attempt.answered}, then the"
            f" connection dropped before the answer was complete ({type(exc).__name__}:"
            f" {exc}); look for a proxy or server limit that cuts long answers",
            answered_status=attempt.answered,
        )
    return ModelError(
        f"could not reach the model endpoint {attempt.url}: {type(exc).__name__}: {exc};"
        " check base_url and that the server is running"
    )


def should_retry(status: int, headers: Mapping[str, str]) -> bool:
    """Whether an error status is worth another attempt, as the official OpenAI SDK
    decides: the server's ``x-should-retry: true|false`` first, else 408, 409, 429, 5xx."""
    asked = {k.lower(): v for k, v in headers.items()}.get("x-should-retry", "").strip().lower()
    if asked == "true":
        return True
    if asked == "false":
        return False
    return status in (408, 409, 429) or status >= 500


def retry_after(
    headers: Mapping[str, str], *, cap: float, now: datetime | None = None
) -> float | None:
    """Seconds the server asks us to wait (``retry-after-ms`` or ``Retry-After``), capped."""
    lowered = {k.lower(): v for k, v in headers.items()}
    seconds: float | None = None
    if "retry-after-ms" in lowered:
        seconds = _float(lowered["retry-after-ms"])
        seconds = None if seconds is None else seconds / 1000
    if seconds is None and "retry-after" in lowered:
        value = lowered["retry-after"]
        seconds = _float(value)
        if seconds is None:
            seconds = _seconds_until(value, now or datetime.now(UTC))
    if seconds is None or seconds < 0:
        return None
    return min(seconds, cap)


def _float(value: str) -> float | None:
    try:
        number = float(value)
    except ValueError:
        return None
    return number if number == number and number != float("inf") else None


def _seconds_until(http_date: str, now: datetime) -> float | None:
    try:
        when = parsedate_to_datetime(http_date)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())

"""A model that speaks the OpenAI Chat Completions API over httpx.

Any server of that wire format works: OpenAI, Azure OpenAI, vLLM, Ollama, llama.cpp
server. Requests are retried on 429, 5xx, timeouts and dropped connections with
exponential backoff and jitter, honouring ``Retry-After`` / ``retry-after-ms``.
"""

from __future__ import annotations

import asyncio
import os
import random
import weakref
from collections.abc import Mapping
from typing import Any

import httpx

from convoq import defaults
from convoq.errors import ModelError, ModelHTTPError
from convoq.messages import Message
from convoq.models._openai_wire import StreamAssembler, build_body, parse_completion, retry_after
from convoq.models.base import ModelRequest, TextDeltaHandler

DEFAULT_BASE_URL = "https://api.openai.com/v1"
MAX_RETRY_AFTER = 60.0
MAX_BACKOFF = 8.0
DEFAULT_MAX_RESPONSE_BYTES = 16 * defaults.MiB
MAX_ERROR_BODY_BYTES = 64 * 1024


class _RetryableError(Exception):
    """One failed attempt worth another try; ``error`` is raised if none is left."""

    def __init__(self, error: ModelError, delay: float | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.delay = delay


class OpenAIChatModel:
    """A chat model behind ``POST {base_url}/chat/completions``.

    Args:
        model: the model name sent to the server, e.g. ``"gpt-4.1-mini"``.
        api_key: bearer token; ``None`` reads ``OPENAI_API_KEY``. Local servers need none.
        base_url: ``None`` reads ``OPENAI_BASE_URL``, else ``https://api.openai.com/v1``.
        timeout: seconds allowed for each of connect, write, pool wait and every read.
        max_retries: further attempts after a 429, a 5xx, a timeout or a dropped connection.
        extra_body: keys merged into every request body (``temperature``, ``max_tokens``...).
        headers: extra HTTP headers for every request.
        http_client: an ``httpx.AsyncClient`` to use; its owner closes it. Without one, a
            client per event loop is created on first use; :meth:`aclose` closes them.
        retry_base_delay: first backoff in seconds, doubled each retry (capped at 8 s).
        max_response_bytes: a non-streamed answer larger than this is refused (ModelError)
            instead of being read into memory whole.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        extra_body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        http_client: httpx.AsyncClient | None = None,
        retry_base_delay: float = 0.5,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if max_retries < 0:
            raise ModelError(f"max_retries must be 0 or more, not {max_retries}")
        self.name = model
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        url = base_url if base_url is not None else os.environ.get("OPENAI_BASE_URL")
        self.base_url = (url or DEFAULT_BASE_URL).rstrip("/")
        self.timeout = httpx.Timeout(timeout)
        self.max_retries = max_retries
        self.retry_base_delay = retry_base_delay
        self.max_response_bytes = max_response_bytes
        self.extra_body = dict(extra_body or {})
        self.headers = dict(headers or {})
        self._http_client = http_client
        # httpx clients belong to the loop they first ran on: one per loop, dropped with it.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient]
        self._clients = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"OpenAIChatModel({self.model!r}, base_url={self.base_url!r})"

    async def request(
        self, request: ModelRequest, *, on_text_delta: TextDeltaHandler | None = None
    ) -> Message:
        """Send ``request``; stream text to ``on_text_delta`` when given.

        Raises:
            ModelHTTPError: the server answered an error status (after retries for 429/5xx).
            ModelError: no API key for OpenAI, a transport failure after retries, or a
                response that cannot be used (not JSON, no choices, bad tool arguments...).
        """
        stream = on_text_delta is not None
        body = build_body(self.model, request, stream=stream, extra_body=self.extra_body)
        headers = self._request_headers(stream)
        attempt = 0
        while True:
            try:
                return await self._attempt(body, headers, on_text_delta)
            except _RetryableError as failure:
                if attempt >= self.max_retries:
                    raise failure.error from failure.__cause__
                await asyncio.sleep(self._delay(attempt, failure.delay))
                attempt += 1

    def _request_headers(self, stream: bool) -> dict[str, str]:
        headers = {"Accept": "text/event-stream" if stream else "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        elif self.base_url == DEFAULT_BASE_URL:
            raise ModelError(
                "no OpenAI API key: set the OPENAI_API_KEY environment variable or pass"
                " api_key=...; for a local server (vLLM, Ollama) pass base_url=..."
            )
        headers.update(self.headers)
        return headers

    def _delay(self, attempt: int, asked: float | None) -> float:
        if asked is not None:
            return asked
        backoff = min(MAX_BACKOFF, self.retry_base_delay * 2.0**attempt)
        return backoff * random.uniform(0.5, 1.0)  # jitter: retries of many turns spread out

    async def _attempt(
        self, body: dict[str, Any], headers: dict[str, str], on_text_delta: TextDeltaHandler | None
    ) -> Message:
        url = f"{self.base_url}/chat/completions"
        delivered = False

        async def deliver(text: str) -> None:
            nonlocal delivered
            delivered = True
            assert on_text_delta is not None
            await on_text_delta(text)

        try:
            async with self._client().stream(
                "POST", url, json=body, headers=headers, timeout=self.timeout
            ) as response:
                await _check_status(response)
                if on_text_delta is None or not _is_event_stream(response):
                    raw = await _read_bounded(response, self.max_response_bytes)
                    message = parse_completion(raw)
                    if on_text_delta is not None and message.text:
                        await on_text_delta(message.text)  # the server did not stream
                    return message
                return await _read_stream(response, deliver)
        except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            error = _transport_error(exc, url, self.timeout)
            if delivered:  # a retry would repeat text already handed out
                raise error from exc
            raise _RetryableError(error) from exc
        except httpx.HTTPError as exc:
            raise _transport_error(exc, url, self.timeout) from exc

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

    async def __aenter__(self) -> OpenAIChatModel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def _read_bounded(response: httpx.Response, limit: int) -> bytes:
    """The whole body, or ModelError once it grows past ``limit`` bytes."""
    raw = bytearray()
    async for chunk in response.aiter_bytes():
        raw += chunk
        if len(raw) > limit:
            raise ModelError(
                f"the model endpoint answered more than max_response_bytes={limit} bytes;"
                " raise max_response_bytes if such answers are expected",
                limit=limit,
            )
    return bytes(raw)


def openai(model_name: str, **kwargs: Any) -> OpenAIChatModel:
    """An :class:`OpenAIChatModel` for ``model_name``; keyword arguments as its constructor."""
    return OpenAIChatModel(model_name, **kwargs)


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
    if status == 429 or status >= 500:
        raise _RetryableError(error, retry_after(response.headers, cap=MAX_RETRY_AFTER))
    raise error


def _is_event_stream(response: httpx.Response) -> bool:
    # A server that ignores "stream": true answers plain JSON; that is read as one delta.
    return "json" not in response.headers.get("content-type", "")


async def _read_stream(response: httpx.Response, deliver: TextDeltaHandler) -> Message:
    assembler = StreamAssembler()
    async for line in response.aiter_lines():
        text = assembler.feed(line)
        if text:
            await deliver(text)
    return assembler.finish()


def _transport_error(exc: httpx.HTTPError, url: str, timeout: httpx.Timeout) -> ModelError:
    if isinstance(exc, httpx.TimeoutException):
        return ModelError(
            f"the model endpoint {url} did not answer within {timeout.read} s"
            f" ({type(exc).__name__}); raise timeout=... or check the server"
        )
    return ModelError(
        f"could not reach the model endpoint {url}: {type(exc).__name__}: {exc};"
        " check base_url and that the server is running"
    )

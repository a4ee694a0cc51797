"""A model that speaks the Anthropic Messages API (``POST {base_url}/v1/messages``) over httpx.

Retries, deadlines and HTTP clients are those of every model over HTTP
(:mod:`convoq.models._http_model`): Anthropic's 529 "overloaded" is a 5xx and retried,
``retry-after`` and ``x-should-retry`` are honoured. The body is
:mod:`convoq.models._anthropic_wire`, the answer :mod:`convoq.models._anthropic_read`.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any, Unpack

from convoq.errors import ModelError
from convoq.models._anthropic_read import AnthropicStream, parse_message
from convoq.models._anthropic_wire import API_VERSION, OutputMode, build_body
from convoq.models._http_attempt import WireCodec
from convoq.models._http_model import HTTPModel, HTTPOptions, key_headers
from convoq.models.base import ModelRequest

DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_MAX_TOKENS = 4096


class AnthropicModel(HTTPModel):
    """A Claude model behind ``POST {base_url}/v1/messages``, speaking API version
    :data:`API_VERSION` (``anthropic-version: 2023-06-01``).

    Settings map to that version's fields: ``max_tokens`` (required by the API:
    ``max_tokens`` here when the settings leave it unset), ``temperature`` (0.0 to 1.0),
    ``top_p``, ``stop_sequences`` and ``tool_choice`` (``required`` is ``any``;
    ``parallel_tool_calls=False`` is ``disable_parallel_tool_use``). It has no ``seed``,
    and takes no temperature above 1.0: a ModelError says so before anything is sent
    (``settings.extra_body`` carries the version's other fields, ``top_k`` say).

    Only the leading system and developer messages become ``system``; a later one (a
    typed output's retry prompt among them) is sent in its place as user-side text.

    A typed output (``ModelRequest.output``) is asked for, by default, as a tool the model
    must call (``output_mode="tool"``): its input is the answer, and becomes the reply's
    text as JSON. Forced tool use works on every Claude model that takes tools and on
    Anthropic-compatible servers; ``output_mode="native"`` sends ``output_config.format``
    (JSON schema structured output) instead, for models that support it.

    Args:
        model: the model name, e.g. ``"claude-sonnet-4-5"``.
        api_key: sent as ``x-api-key``; ``None`` reads ``ANTHROPIC_API_KEY``.
        auth_token: sent as ``Authorization: Bearer``; ``None`` reads
            ``ANTHROPIC_AUTH_TOKEN`` (gateways and proxies that take a bearer token).
        base_url: ``None`` reads ``ANTHROPIC_BASE_URL``, else ``https://api.anthropic.com``
            (without ``/v1``, as the official SDK takes it).
        max_tokens: the answer's token limit when the request's settings give none.
        output_mode: ``"tool"`` or ``"native"``, as above.
        **options: as :class:`~convoq.models._http_model.HTTPModel` (timeouts, retries,
            ``extra_body``, ``headers``, ``query``, ``http_client``...).
    """

    codec = WireCodec(partial(parse_message, output_tool=None), AnthropicStream)

    # It asks for request.output itself (json schema, or a forced tool on Anthropic).
    structured_output = True

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        auth_token: str | None = None,
        base_url: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        output_mode: OutputMode = "tool",
        **options: Unpack[HTTPOptions],
    ) -> None:
        if output_mode not in ("tool", "native"):
            raise ModelError(f"output_mode must be 'tool' or 'native', not {output_mode!r}")
        if max_tokens < 1:
            raise ModelError(f"max_tokens must be 1 or more, not {max_tokens}")
        url = base_url if base_url is not None else os.environ.get("ANTHROPIC_BASE_URL")
        super().__init__(model, url or DEFAULT_BASE_URL, **options)
        self.api_key = api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY")
        token = auth_token if auth_token is not None else os.environ.get("ANTHROPIC_AUTH_TOKEN")
        self.auth_token = token
        self.max_tokens = max_tokens
        self.output_mode: OutputMode = output_mode

    def _url(self) -> str:
        return f"{self.base_url}/v1/messages"

    def _auth_headers(self) -> dict[str, str]:
        if not self.api_key and not self.auth_token and self.base_url == DEFAULT_BASE_URL:
            raise ModelError(
                "no Anthropic API key: set the ANTHROPIC_API_KEY environment variable or"
                " pass api_key=... (or auth_token=... for a bearer token)"
            )
        headers = {"anthropic-version": API_VERSION}
        headers.update(key_headers(self.api_key, "x-api-key"))
        headers.update(key_headers(self.auth_token, "Authorization"))
        return headers

    def _build_body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        return build_body(self.model, request, stream=stream, extra_body=self.extra_body,
                          max_tokens=self.max_tokens, output_mode=self.output_mode)  # fmt: skip

    def _codec(self, request: ModelRequest) -> WireCodec:
        if request.output is None or self.output_mode != "tool":
            return self.codec
        name = request.output.name
        return WireCodec(partial(parse_message, output_tool=name), partial(AnthropicStream, name))


def anthropic(model_name: str, **kwargs: Any) -> AnthropicModel:
    """An :class:`AnthropicModel` for ``model_name``; keyword arguments as its constructor."""
    return AnthropicModel(model_name, **kwargs)

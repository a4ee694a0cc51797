"""A model that speaks the OpenAI Chat Completions API over httpx.

Any server of that wire format works: OpenAI, Azure OpenAI, vLLM, Ollama, llama.cpp
server, LM Studio. Retries, deadlines and HTTP clients are those of every model over HTTP
(:mod:`convoq.models._http_model`); the body and the answer are
:mod:`convoq.models._openai_wire`.
"""

from __future__ import annotations

import os
from typing import Any, Unpack

from convoq.errors import ModelError
from convoq.models._http_attempt import WireCodec
from convoq.models._http_model import HTTPModel, HTTPOptions, key_headers
from convoq.models._openai_wire import StreamAssembler, build_body, parse_completion
from convoq.models.base import ModelRequest

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OpenAIHTTPModel(HTTPModel):
    """What OpenAI's wire formats share: the base URL (``OPENAI_BASE_URL``, else
    OpenAI's) and the key (``OPENAI_API_KEY``) with the header that carries it."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        api_key_header: str = "Authorization",
        **options: Unpack[HTTPOptions],
    ) -> None:
        url = base_url if base_url is not None else os.environ.get("OPENAI_BASE_URL")
        super().__init__(model, url or DEFAULT_BASE_URL, **options)
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.api_key_header = api_key_header

    def _auth_headers(self) -> dict[str, str]:
        return openai_auth(self.api_key, self.api_key_header, self.base_url)


class OpenAIChatModel(OpenAIHTTPModel):
    """A chat model behind ``POST {base_url}/chat/completions``.

    Args:
        model: the model name sent to the server, e.g. ``"gpt-4.1-mini"``.
        api_key: the key; ``None`` reads ``OPENAI_API_KEY``. Local servers need none.
        base_url: ``None`` reads ``OPENAI_BASE_URL``, else ``https://api.openai.com/v1``.
        api_key_header: the header that carries the key: ``Authorization`` (as
            ``Bearer KEY``, the default) or e.g. Azure OpenAI's ``api-key`` (the key alone).
        structured_output: the server takes ``response_format`` with a JSON schema (OpenAI,
            vLLM, Ollama do); False: an output type is asked for in the instructions.
        **options: as :class:`~convoq.models._http_model.HTTPModel` (timeouts, retries,
            ``extra_body``, ``headers``, ``query``, ``http_client``...); a request's
            ``settings.extra_body`` is merged after ``extra_body``.

    A request's :class:`ModelSettings` map to their Chat Completions fields (``max_tokens``
    is sent as ``max_completion_tokens``; a named ``tool_choice`` as
    ``{"type": "function", "function": {"name": ...}}``).
    """

    codec = WireCodec(parse_completion, StreamAssembler)

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        api_key_header: str = "Authorization",
        structured_output: bool = True,
        **options: Unpack[HTTPOptions],
    ) -> None:
        super().__init__(
            model, api_key=api_key, base_url=base_url, api_key_header=api_key_header, **options
        )
        self.structured_output = structured_output

    def _url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def _build_body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        return build_body(
            self.model, request, stream=stream, extra_body=self.extra_body,
            structured_output=self.structured_output,
        )  # fmt: skip


def openai_auth(api_key: str | None, header: str, base_url: str) -> dict[str, str]:
    """The key header of the OpenAI wire formats; ModelError for OpenAI itself without a key."""
    if not api_key and base_url == DEFAULT_BASE_URL:
        raise ModelError(
            "no OpenAI API key: set the OPENAI_API_KEY environment variable or pass"
            " api_key=...; for a local server (vLLM, Ollama) pass base_url=..."
        )
    return key_headers(api_key, header)


def openai(model_name: str, **kwargs: Any) -> OpenAIChatModel:
    """An :class:`OpenAIChatModel` for ``model_name``; keyword arguments as its constructor."""
    return OpenAIChatModel(model_name, **kwargs)

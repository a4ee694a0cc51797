"""A model that speaks the OpenAI Responses API (``POST {base_url}/responses``) over httpx.

Retries, deadlines and HTTP clients are those of every model over HTTP
(:mod:`convoq.models._http_model`); the body and the answer are
:mod:`convoq.models._responses_wire`. History stays convoq's: each request sends the whole
window and asks the server to store nothing (``store: false``).
"""

from __future__ import annotations

from typing import Any, Unpack

from convoq.models._http_attempt import WireCodec
from convoq.models._http_model import HTTPOptions
from convoq.models._responses_wire import ResponsesStream, build_body, parse_response
from convoq.models.base import ModelRequest
from convoq.models.openai import OpenAIHTTPModel


class OpenAIResponsesModel(OpenAIHTTPModel):
    """A model behind ``POST {base_url}/responses``.

    Settings map to ``temperature``, ``top_p``, ``max_output_tokens``, ``tool_choice`` and
    ``parallel_tool_calls``; the API has no ``seed`` or ``stop`` (a ModelError says so). A
    typed output is asked for as ``text.format`` of type ``json_schema``.

    Args:
        model: the model name sent to the server, e.g. ``"gpt-4.1-mini"``.
        api_key: the key; ``None`` reads ``OPENAI_API_KEY``. Local servers need none.
        base_url: ``None`` reads ``OPENAI_BASE_URL``, else ``https://api.openai.com/v1``.
        api_key_header: ``Authorization`` (``Bearer KEY``, the default) or e.g. ``api-key``.
        strict_tools: the ``strict`` flag sent with every function tool. ``None`` (the
            default): true where the tool's schema qualifies for strict mode (every object
            closed, every property required), else false; ``False`` for servers that do
            not support strict schemas.
        **options: as :class:`~convoq.models._http_model.HTTPModel` (timeouts, retries,
            ``extra_body``, ``headers``, ``query``, ``http_client``...).
    """

    codec = WireCodec(parse_response, ResponsesStream)

    # It asks for request.output itself (json schema, or a forced tool on Anthropic).
    structured_output = True

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        api_key_header: str = "Authorization",
        strict_tools: bool | None = None,
        **options: Unpack[HTTPOptions],
    ) -> None:
        super().__init__(
            model, api_key=api_key, base_url=base_url, api_key_header=api_key_header, **options
        )
        self.strict_tools = strict_tools

    def _url(self) -> str:
        return f"{self.base_url}/responses"

    def _build_body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        return build_body(self.model, request, stream=stream, extra_body=self.extra_body,
                          strict_tools=self.strict_tools)  # fmt: skip


def responses(model_name: str, **kwargs: Any) -> OpenAIResponsesModel:
    """An :class:`OpenAIResponsesModel` for ``model_name``; keyword arguments as its
    constructor."""
    return OpenAIResponsesModel(model_name, **kwargs)

"""An HTTP output schema naming a required property twice is refused by the gateway's own
schema (422 problem+json, the document says ``uniqueItems``), as the client behind it
refuses it: a request the document admits is one the gateway takes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from convoq.gateway import create_app
from convoq.gateway.inputs import OutputSchemaIn, TurnRequest
from convoq.settings import ConvoqSettings


def test_the_document_says_required_names_are_unique(redis_url: str) -> None:
    settings = ConvoqSettings.resolve(redis_url=redis_url, gateway_api_keys=[])
    schemas = create_app(settings).openapi()["components"]["schemas"]
    assert schemas["OutputSchemaIn"]["properties"]["required"]["uniqueItems"] is True


def test_a_required_name_twice_is_refused_before_the_client() -> None:
    body = {
        "message": "hi",
        "agent": "echo",
        "output_schema": {"type": "object", "required": ["a", "a"]},
    }
    with pytest.raises(ValidationError, match="more than once"):
        TurnRequest.model_validate(body)
    assert OutputSchemaIn.model_validate({"type": "object", "required": ["a", "b"]})

"""The OpenAPI document (what ``/docs`` renders) has its descriptions, taken from
docstrings, in markdown: reST's double-backtick literals and roles become code spans."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from convoq.gateway import create_app
from convoq.gateway import document as openapi_document
from convoq.settings import ConvoqSettings


def _descriptions(node: Any) -> Iterator[str]:
    if isinstance(node, list):
        for item in node:
            yield from _descriptions(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                yield value
            else:
                yield from _descriptions(value)


def test_every_description_is_markdown_without_rest_markup(redis_url: str) -> None:
    settings = ConvoqSettings.resolve(redis_url=redis_url, gateway_api_keys=[])
    document = create_app(settings).openapi()
    descriptions = list(_descriptions(document))
    rest = [d for d in descriptions if "``" in d or re.search(r":[a-z]+:`", d)]
    assert rest == []
    history = document["paths"]["/v1/conversations/{cid}/messages"]["get"]["description"]
    assert "`limit` of them from `offset`" in history


def test_markdown_turns_literals_and_roles_into_code_spans() -> None:
    text = "``limit`` rows, see :class:`~convoq.client.Client` and :func:`convoq.ids.key_part`"
    assert openapi_document.markdown(text) == "`limit` rows, see `Client` and `convoq.ids.key_part`"

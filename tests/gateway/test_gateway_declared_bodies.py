"""A body FastAPI reads for a route (a decision's JSON) is answered as the bodies read by
hand are: the key first (401, 403 before any 422 about the body), then the path, query and
headers, then the media type (415), then the body (422, located inside the body, JSON
parsed as pydantic parses it); and the document FastAPI builds shows no parameter as
nullable and the bearer scheme on every route behind a key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from convoq.gateway import create_app
from convoq.settings import ConvoqSettings, GatewayKey
from tests.support.redis_server import RedisServer

ADMIN = "declared-bodies-admin-0123"
READER = "declared-bodies-reader-0123"
DECIDE = "/v1/conversations/c-1/turns/t1/approvals/call-1"
AS_JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def http(redis_server: RedisServer) -> Iterator[TestClient]:
    keys = [GatewayKey(key=ADMIN, scopes=("admin",)), GatewayKey(key=READER, scopes=("read",))]
    settings = ConvoqSettings.resolve(redis_url=redis_server.url, gateway_api_keys=keys)
    with TestClient(create_app(settings)) as client:
        yield client


def _as(key: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **headers}


def _problem(response: httpx.Response, status: int, title: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["title"] == title, body
    return body


def test_the_key_is_checked_before_the_body_is_read(http: TestClient) -> None:
    for headers in [AS_JSON, {**AS_JSON, "Authorization": "Bearer not-a-key-of-this-one"}]:
        refused = http.post(DECIDE, content=b"{nope", headers=headers)
        _problem(refused, 401, "Unauthorized")
        assert refused.headers["www-authenticate"] == "Bearer"
    _problem(http.post(DECIDE, content=b"{nope", headers=_as(READER, **AS_JSON)), 403, "Forbidden")
    bad = _problem(http.post(DECIDE, content=b"{nope", headers=_as(ADMIN, **AS_JSON)), 422,
                   "ValidationError")  # fmt: skip
    # Worded as pydantic words it, as for a body read by hand.
    assert bad["errors"] == [
        {"loc": [], "msg": "Invalid JSON: key must be a string at line 1 column 2"}
    ]


@pytest.mark.parametrize(
    "content", ['{"decision": "approve"}'.encode("utf-16"), b'{"decision": "\xff"}']
)
def test_a_body_that_is_not_utf8_is_a_422(http: TestClient, content: bytes) -> None:
    _problem(http.post(DECIDE, content=content, headers=_as(ADMIN, **AS_JSON)), 422,
             "ValidationError")  # fmt: skip


@pytest.mark.parametrize("media_type", ["text/plain", "application/merge-patch+json"])
def test_another_media_type_is_a_415_once_the_path_is_valid(
    http: TestClient, media_type: str
) -> None:
    body = b'{"decision": "approve"}'
    headers = _as(ADMIN, **{"Content-Type": media_type})
    _problem(http.post(DECIDE, content=body, headers=headers), 415, "UnsupportedMediaType")
    bad_path = http.post(DECIDE.replace("t1", "t.1"), content=body, headers=headers)
    assert [e["loc"] for e in _problem(bad_path, 422, "ValidationError")["errors"]] == [
        ["path", "tid"]
    ]


def test_body_errors_are_located_in_the_body_and_come_after_the_path(http: TestClient) -> None:
    wrong = {"decision": "maybe"}
    refused = _problem(http.post(DECIDE, json=wrong, headers=_as(ADMIN)), 422, "ValidationError")
    assert [e["loc"] for e in refused["errors"]] == [["decision"]]
    both = http.post(DECIDE.replace("t1", "t.1"), json=wrong, headers=_as(ADMIN))
    assert [e["loc"] for e in _problem(both, 422, "ValidationError")["errors"]] == [["path", "tid"]]


def test_a_body_without_a_content_type_is_read_as_json(http: TestClient) -> None:
    answer = http.post(DECIDE, content=b'{"decision": "approve"}', headers=_as(ADMIN))
    _problem(answer, 404, "UnknownTurnError")  # read, validated, and the turn looked up


def test_the_document_has_no_nullable_parameter_and_a_key_on_every_keyed_route(
    http: TestClient,
) -> None:
    document = http.get("/openapi.json").json()
    for path, operations in document["paths"].items():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                assert "anyOf" not in parameter["schema"], (path, parameter)
                assert parameter["schema"].get("default", 0) is not None, (path, parameter)
            public = path in ("/healthz", "/readyz")
            assert operation["security"] == ([] if public else [{"bearer": []}]), path
    assert document["components"]["securitySchemes"] == {
        "bearer": {"type": "http", "scheme": "bearer"}
    }

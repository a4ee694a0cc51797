"""A multipart upload carries ``metadata`` as a form field holding a JSON object, stored
with the turn as a JSON body's is; bad JSON, another JSON value, a file or an oversize
field is a clear problem+json (422, 413) and nothing is written."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
import redis

from convoq.cli.demo import tiny_png
from tests.support.gateway import GatewayProcess, module_gateway, turns_path
from tests.support.workers import WorkerPool, module_pool

pytestmark = pytest.mark.slow

pool = module_pool(1)
gateway = module_gateway(callback_allowed_networks="")

PNG = [("files", ("a.png", tiny_png(), "image/png"))]


def _cid() -> str:
    return f"upload-{uuid.uuid4().hex[:8]}"


def _post(http: httpx.Client, cid: str, metadata: object, **extra: object) -> httpx.Response:
    data = {"text": "upload", "agent": "echo", "metadata": metadata}
    return http.post(turns_path(cid), data=data, files=extra.get("files", PNG))


def test_an_upload_turn_keeps_its_metadata(gateway: GatewayProcess) -> None:
    cid = _cid()
    metadata = {"customer": "c-42", "tags": ["vip"], "tier": 3}
    with gateway.client("submitter") as http:
        accepted = _post(http, cid, json.dumps(metadata, indent=2))
        assert accepted.status_code == 202, accepted.text
        done = http.get(f"{turns_path(cid)}/{accepted.json()['turn_id']}", params={"wait": 30})
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "succeeded" and done.json()["metadata"] == metadata


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ('{"customer": ', "a JSON object, e.g."),
        ("[1, 2]", "not a JSON list"),
        ('"c-42"', "not a JSON str"),
    ],
    ids=["bad-json", "a-list", "a-string"],
)
def test_metadata_that_is_no_json_object_is_422_and_nothing_is_written(
    gateway: GatewayProcess, r: redis.Redis, pool: WorkerPool, metadata: str, says: str
) -> None:
    cid = _cid()
    with gateway.client("submitter") as http:
        refused = _post(http, cid, metadata)
    assert refused.status_code == 422, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    body = refused.json()
    assert body["title"] == "ValidationError" and says in body["detail"]
    assert body["errors"][0]["loc"] == ["metadata"]
    assert list(r.scan_iter(match=f"{pool.prefix}:{{{cid}}}*")) == []


def test_metadata_as_a_file_or_oversize_is_refused(
    gateway: GatewayProcess, r: redis.Redis, pool: WorkerPool
) -> None:
    cid = _cid()
    with gateway.client("submitter") as http:
        as_file = http.post(
            turns_path(cid),
            data={"text": "upload", "agent": "echo"},
            files=[*PNG, ("metadata", ("m.json", b'{"a": 1}', "application/json"))],
        )
        huge = _post(http, cid, json.dumps({"note": "x" * 70_000}))
    assert as_file.status_code == 422 and "not a file" in as_file.json()["detail"]
    assert huge.status_code == 413 and huge.json()["title"] == "RequestTooLarge", huge.text
    assert list(r.scan_iter(match=f"{pool.prefix}:{{{cid}}}*")) == []


def test_the_document_shows_metadata_as_a_multipart_field(gateway: GatewayProcess) -> None:
    with gateway.client() as http:
        document = http.get("/openapi.json").json()
    submit = document["paths"]["/v1/conversations/{cid}/turns"]["post"]
    field = submit["requestBody"]["content"]["multipart/form-data"]["schema"]["properties"]
    # An object property of a multipart body: its part holds the object's JSON.
    assert field["metadata"]["type"] == "object" and "JSON" in field["metadata"]["description"]

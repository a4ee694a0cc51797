"""The gateway at its edges, as a real uvicorn process over real workers and Redis: ids
outside Latin-1 and links that are percent-encoded, paths that are not UTF-8, approvals
paged per key, stream ids out of range, idempotency keys reused for another request,
callbacks a deployment cannot sign, errors in HTTP's terms, and the catch-all 500."""

from __future__ import annotations

import uuid
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import redis

from convoq.gateway import create_app
from convoq.settings import GatewayKey
from tests.support.gateway import GatewayProcess, module_gateway, running_gateway, turns_path
from tests.support.workers import WorkerPool, module_pool

pytestmark = pytest.mark.slow

pool = module_pool(1)
gateway = module_gateway()


def _problem(response: httpx.Response, status: int, title: str) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, object] = response.json()
    assert body["title"] == title, body
    return body


def _final(http: httpx.Client, url: str, until: str = "final") -> dict[str, object]:
    body: dict[str, object] = http.get(url, params={"wait": 30, "until": until}).json()
    return body


def _storedturns_path(r: redis.Redis, pool: WorkerPool) -> set[bytes]:
    return set(r.scan_iter(match=f"{pool.prefix}:*:turn:*"))


@pytest.mark.parametrize("label", ["\U0001f600", "\u202eevil", "user 42", "caf\u00e9/no"])
def test_ids_outside_latin1_work_end_to_end_and_links_are_percent_encoded(
    gateway: GatewayProcess, pool: WorkerPool, r: redis.Redis, label: str
) -> None:
    cid = f"{label.replace('/', '-')}-{uuid.uuid4().hex[:6]}"
    before = _storedturns_path(r, pool)
    with gateway.client("admin") as http:
        response = http.post(turns_path(cid), json={"message": "hi", "agent": "echo"})
        assert response.status_code == 202, response.text
        accepted = response.json()
        assert accepted["conversation_id"] == cid
        location = response.headers["location"]
        assert location == accepted["links"]["self"]
        assert location.isascii() and " " not in location
        assert location.endswith(f"{turns_path(cid)}/{accepted['turn_id']}")
        assert accepted["links"]["events"] == f"{location}/events"
        done = _final(http, location)
        assert done["status"] == "succeeded" and done["text"] == "seen: hi"
        assert done["conversation_id"] == cid
        history = http.get(f"/v1/conversations/{quote(cid, safe='')}/messages").json()
    assert history["total"] == 2  # stored once: the answer reported the one write
    assert len(_storedturns_path(r, pool) - before) == 1


def test_a_path_that_is_not_utf8_is_422_and_nothing_is_written(
    gateway: GatewayProcess, pool: WorkerPool, r: redis.Redis
) -> None:
    before = _storedturns_path(r, pool)
    with gateway.client("admin") as http:
        for path in ["%FF", "ok%C3", "%C3%28-x"]:
            submitted = http.post(
                f"/v1/conversations/{path}/turns", json={"message": "hi", "agent": "echo"}
            )
            _problem(submitted, 422, "InvalidPathEncoding")
            _problem(http.get(f"/v1/conversations/{path}/messages"), 422, "InvalidPathEncoding")
        # The id U+FFFD itself, sent as its UTF-8 bytes, is an id like any other.
        replacement = http.get(f"/v1/conversations/{quote(chr(0xFFFD))}/messages")
        assert replacement.status_code == 200
    assert _storedturns_path(r, pool) == before
    assert list(r.scan_iter(match=f"{pool.prefix}:*%EF%BF%BD*")) == []


def _park(http: httpx.Client, cid: str) -> str:
    response = http.post(turns_path(cid), json={"message": "pay", "agent": "approver"})
    assert response.status_code == 202, response.text
    tid = str(response.json()["turn_id"])
    assert (
        _final(http, f"{turns_path(cid)}/{tid}", until="settled")["status"] == "awaiting_approval"
    )
    return tid


def test_approvals_are_filtered_by_the_keys_prefix_before_the_limit_and_paged(
    gateway: GatewayProcess,
) -> None:
    with gateway.client("admin") as admin, gateway.client("tenant") as tenant:
        mine = f"tenant-a:{uuid.uuid4().hex[:6]}"
        parked = [(mine, _park(tenant, mine))]
        for _ in range(2):  # parked later (newer) by another tenant
            other = f"tenant-b:{uuid.uuid4().hex[:6]}"
            parked.append((other, _park(admin, other)))
        try:
            page = tenant.get("/v1/approvals", params={"limit": 1}).json()
            assert [t["turn_id"] for t in page["turns"]] == [parked[0][1]]
            assert page["next_offset"] is None
            seen: list[str] = []
            offset: int | None = 0
            while offset is not None:
                page = admin.get("/v1/approvals", params={"limit": 1, "offset": offset}).json()
                assert len(page["turns"]) <= 1
                seen += [t["turn_id"] for t in page["turns"]]
                offset = page["next_offset"]
            assert seen[:3] == [tid for _, tid in reversed(parked)]  # newest first
        finally:
            for cid, tid in parked:
                admin.post(f"{turns_path(cid)}/{tid}/discard")


def test_out_of_range_event_ids_are_422_before_the_stream_starts(gateway: GatewayProcess) -> None:
    cid = f"events-{uuid.uuid4().hex[:6]}"
    with gateway.client("admin") as http:
        tid = http.post(turns_path(cid), json={"message": "hi", "agent": "echo"}).json()["turn_id"]
        url = f"{turns_path(cid)}/{tid}/events"
        for bad in ["99999999999999999999-0", "0-99999999999999999999", "18446744073709551616-0"]:
            _problem(http.get(url, headers={"Last-Event-ID": bad}), 422, "InvalidEventId")
            _problem(http.get(url, params={"after": bad}), 422, "InvalidEventId")
            # A bad ?after= is refused even beside a Last-Event-ID, which takes precedence.
            both = http.get(url, params={"after": bad}, headers={"Last-Event-ID": ""})
            _problem(both, 422, "InvalidEventId")
        # The largest id the gateway takes is valid: nothing comes after it, the stream
        # stays open.
        with http.stream(
            "GET", url, headers={"Last-Event-ID": "9999999999999999999-9999999999999999999"},
            timeout=httpx.Timeout(60, read=3),
        ) as top:  # fmt: skip
            assert top.status_code == 200
            first = next(top.iter_lines())
            assert first.startswith("retry:")


def test_an_idempotency_key_reused_for_another_request_is_409_and_a_replay_says_where_it_stands(
    gateway: GatewayProcess, pool: WorkerPool, r: redis.Redis
) -> None:
    cid = f"idem-{uuid.uuid4().hex[:6]}"
    headers = {"Idempotency-Key": f"order-{uuid.uuid4().hex[:6]}"}
    with gateway.client("admin") as http:
        body = {"message": "once", "agent": "echo"}
        first = http.post(turns_path(cid), json=body, headers=headers)
        assert first.status_code == 202 and first.json()["status"] == "queued"
        tid = first.json()["turn_id"]
        assert _final(http, f"{turns_path(cid)}/{tid}")["status"] == "succeeded"
        replay = http.post(turns_path(cid), json=body, headers=headers)
        assert replay.status_code == 202
        assert replay.json()["turn_id"] == tid
        assert replay.json()["status"] == "succeeded"  # not "queued" again
        before = _storedturns_path(r, pool)
        for other, differs in [
            ({"message": "twice", "agent": "echo"}, ["message"]),
            ({"message": "once", "agent": "approver"}, ["agent"]),
            ({"message": "once", "agent": "echo", "keep_last_turns": 3}, ["keep_last_turns"]),
        ]:
            refused = _problem(http.post(turns_path(cid), json=other, headers=headers), 409,
                               "IdempotencyKeyReusedError")  # fmt: skip
            assert refused["error"]["details"]["mismatch"] == differs  # type: ignore[index]
            assert refused["error"]["details"]["turn_id"] == tid  # type: ignore[index]
            assert "idempotency key" in str(refused["detail"])
        assert _storedturns_path(r, pool) == before
        assert http.get(f"/v1/conversations/{cid}/messages").json()["total"] == 2


def test_a_callback_url_is_refused_where_the_deployment_cannot_sign(
    pool: WorkerPool, r: redis.Redis, tmp_path: Path
) -> None:
    cid = f"unsigned-{uuid.uuid4().hex[:6]}"
    with running_gateway(pool, tmp_path, webhook_secret="") as unsigned, unsigned.client() as http:
        body = {"message": "hi", "agent": "echo", "callback_url": "https://hooks.example.test/x"}
        refused = _problem(http.post(turns_path(cid), json=body), 422, "InvalidCallbackUrlError")
        details = refused["error"]["details"]  # type: ignore[index]
        assert details["setting"] == "CONVOQ_WEBHOOK_SECRET"
        assert "CONVOQ_WEBHOOK_SECRET" in str(refused["detail"])
        # Without a callback the same deployment queues turns as usual.
        accepted = http.post(turns_path(cid), json={"message": "hi", "agent": "echo"})
        assert accepted.status_code == 202
    assert len(list(r.scan_iter(match=f"{pool.prefix}:{{{cid}}}:turn:*"))) == 1


def test_errors_speak_http_and_name_no_turn_they_do_not_have(gateway: GatewayProcess) -> None:
    cid = f"busy-{uuid.uuid4().hex[:6]}"
    with gateway.client("admin") as http:
        tid = _park(http, cid)
        try:
            busy = _problem(http.delete(f"/v1/conversations/{cid}"), 409, "ConversationBusyError")
            assert "?force=true" in str(busy["detail"])
            assert "force=True" not in str(busy["detail"]) and "if_busy" not in str(busy["detail"])
            assert "turn_id" not in busy["error"]["details"]  # type: ignore[index]
            body = {"message": "x", "agent": "echo", "if_busy": "reject"}
            rejected = _problem(http.post(turns_path(cid), json=body), 409, "ConversationBusyError")
            assert '"if_busy": "queue"' in str(rejected["detail"])
            assert "force" not in str(rejected["detail"])
        finally:
            http.post(f"{turns_path(cid)}/{tid}/discard")
        assert http.delete(f"/v1/conversations/{cid}", params={"force": "true"}).status_code == 204


async def test_an_unexpected_error_is_a_problem_json_500() -> None:
    key = "key-for-the-catch-all-test"
    app = create_app(
        redis_url="redis://127.0.0.1:1/0",
        gateway_api_keys=[GatewayKey(key=key, scopes=("admin",))],
    )

    @app.get("/v1/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        response = await http.get("/v1/boom")
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["title"] == "InternalError" and body["status"] == 500
    assert "a bug" not in response.text  # nothing internal leaks


def test_the_document_states_every_answer_its_limits_and_who_needs_a_key(
    gateway: GatewayProcess,
) -> None:
    document = httpx.get(f"{gateway.url}/openapi.json").json()
    paths = document["paths"]
    problem = {"$ref": "#/components/schemas/Problem"}
    assert document["components"]["schemas"]["Problem"]["required"] == [
        "type", "title", "status", "detail"
    ]  # fmt: skip
    submit = paths["/v1/conversations/{cid}/turns"]["post"]
    for status in ["401", "403", "409", "413", "415", "422", "429", "500", "503"]:
        assert submit["responses"][status]["content"] == {
            "application/problem+json": {"schema": problem}
        }, status
    assert "Retry-After" in submit["responses"]["429"]["headers"]
    assert "Location" in submit["responses"]["202"]["headers"]
    assert "404" in paths["/v1/conversations/{cid}/turns/{tid}"]["get"]["responses"]
    for public in ["/healthz", "/readyz"]:
        assert paths[public]["get"]["security"] == []
        assert "401" not in paths[public]["get"]["responses"]
    assert document["security"] == [{"bearer": []}]
    cid = next(p for p in submit["parameters"] if p["name"] == "cid")["schema"]
    assert cid["maxLength"] == 256 and cid["pattern"].startswith("^")
    tid = paths["/v1/conversations/{cid}/turns/{tid}"]["get"]["parameters"][1]["schema"]
    assert tid["pattern"] == "^[A-Za-z0-9_-]{1,64}$"
    schemas = document["components"]["schemas"]
    assert schemas["TurnRequest"]["properties"]["agent"]["maxLength"] == 256
    assert "echo" in schemas["TurnRequest"]["properties"]["agent"]["enum"]  # the workers'
    assert schemas["TextIn"]["properties"]["text"]["maxLength"] > 0
    form = submit["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert form["required"] == ["agent", "text"]
    assert form["properties"]["files"]["items"] == {
        "type": "string", "format": "binary", "minLength": 1
    }  # fmt: skip
    assert form["properties"]["keep_last_turns"]["type"] == "integer"  # not nullable
    assert "/redoc" not in httpx.get(f"{gateway.url}/docs").text
    assert httpx.get(f"{gateway.url}/redoc").status_code == 404


def test_a_method_a_path_does_not_serve_is_405_listing_every_method_it_does(
    gateway: GatewayProcess,
) -> None:
    with gateway.client("admin") as http:
        answer = http.put("/v1/conversations/x")
        _problem(answer, 405, "HTTPError")
        assert answer.headers["allow"] == "DELETE, GET"  # GET: the console's overview
        turn = http.request("PATCH", "/v1/conversations/x/turns/abc")
        _problem(turn, 405, "HTTPError")
        assert turn.headers["allow"] == "GET"


def test_a_multipart_turn_needs_its_text_and_files_must_be_files(
    gateway: GatewayProcess, pool: WorkerPool, r: redis.Redis
) -> None:
    cid = f"form-{uuid.uuid4().hex[:6]}"
    before = _storedturns_path(r, pool)
    with gateway.client("admin") as http:
        png = [("files", ("a.png", b"\x89PNG-bytes", "image/png"))]
        no_text = http.post(turns_path(cid), data={"agent": "echo"}, files=png)
        assert _problem(no_text, 422, "ValidationError")["errors"] == [
            {"loc": ["text"], "msg": "required, at least 1 character"}
        ]
        as_field = http.post(turns_path(cid), data={"agent": "echo", "text": "hi", "files": "x"},
                             files=png)  # fmt: skip
        _problem(as_field, 422, "ValidationError")
        unknown = http.post(turns_path(cid), data={"agent": "echo", "text": "hi", "colour": "red"},
                            files=png)  # fmt: skip
        _problem(unknown, 422, "ValidationError")
    assert _storedturns_path(r, pool) == before

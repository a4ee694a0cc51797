"""The HTTP gateway, as a real uvicorn process over real workers and Redis: every
endpoint, auth (401/403 with nothing written), problem+json errors, idempotency, SSE
resumed with Last-Event-ID, long-poll, approvals, size limits, health and documents."""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis

from convoq.cli.demo import tiny_pdf, tiny_png
from tests.support.gateway import GatewayProcess, module_gateway, running_gateway, turns_path
from tests.support.workers import WorkerPool, module_pool

pytestmark = pytest.mark.slow
MAX_TURN_BYTES = 256 * 1024

pool = module_pool(2, max_turn_bytes=MAX_TURN_BYTES)
# The gateway allows no internal callback receivers (the workers' test setting is not
# inherited): callbacks to loopback are refused at submit.
gateway = module_gateway(callback_allowed_networks="")


def _cid(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _submit(http: httpx.Client, cid: str, text: str, agent: str = "echo", **extra: object) -> str:
    response = http.post(turns_path(cid), json={"message": text, "agent": agent, **extra})
    assert response.status_code == 202, response.text
    return str(response.json()["turn_id"])


def _wait(http: httpx.Client, cid: str, tid: str, until: str = "settled") -> dict[str, object]:
    response = http.get(f"{turns_path(cid)}/{tid}", params={"wait": 30, "until": until})
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


def _keys_of(r: redis.Redis, pool: WorkerPool, cid: str) -> list[bytes]:
    return list(r.scan_iter(match=f"{pool.prefix}:{{{cid}}}*"))


def _queued_kicks(r: redis.Redis, pool: WorkerPool) -> int:
    return sum(int(r.llen(f"{pool.prefix}.p{i}")) for i in range(pool.partitions))


def _problem(response: httpx.Response, status: int, title: str) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, object] = response.json()
    assert body["type"] == f"urn:convoq:error:{title}"
    assert body["title"] == title and body["status"] == status and body["detail"]
    return body


# -- auth ---------------------------------------------------------------------------------
def test_no_key_or_an_unknown_key_is_401_and_nothing_is_written(
    gateway: GatewayProcess, pool: WorkerPool, r: redis.Redis
) -> None:
    cid = _cid("noauth")
    before = _queued_kicks(r, pool)
    for key_header in [None, "Bearer not-a-key-of-this-gateway", "Basic dXNlcjpwdw=="]:
        headers = {"Authorization": key_header} if key_header else {}
        body = {"message": "hi", "agent": "echo"}
        response = httpx.post(f"{gateway.url}{turns_path(cid)}", json=body, headers=headers)
        _problem(response, 401, "Unauthorized")
        assert response.headers["www-authenticate"] == "Bearer"
    # An unauthenticated request with a bad body still gets 401, not 422.
    _problem(httpx.post(f"{gateway.url}{turns_path(cid)}", content=b"{nope"), 401, "Unauthorized")
    _problem(httpx.get(f"{gateway.url}/v1/approvals"), 401, "Unauthorized")
    assert _keys_of(r, pool, cid) == []
    assert _queued_kicks(r, pool) == before


def test_a_key_without_the_scope_or_outside_its_prefix_is_403_and_nothing_changes(
    gateway: GatewayProcess, pool: WorkerPool, r: redis.Redis
) -> None:
    cid = _cid("scopes")
    before = _queued_kicks(r, pool)
    with gateway.client("reader") as reader, gateway.client("tenant") as tenant:
        _problem(reader.post(turns_path(cid), json={"message": "hi", "agent": "echo"}), 403,
                 "Forbidden")  # fmt: skip
        _problem(tenant.post(turns_path(cid), json={"message": "hi", "agent": "echo"}), 403,
                 "Forbidden")  # fmt: skip
    assert _keys_of(r, pool, cid) == []
    assert _queued_kicks(r, pool) == before

    with gateway.client("submitter") as submitter, gateway.client("approver") as approver:
        tid = _submit(submitter, cid, "keep me")
        assert _wait(submitter, cid, tid)["status"] == "succeeded"
        stored = sorted(_keys_of(r, pool, cid))
        _problem(submitter.delete(f"/v1/conversations/{cid}"), 403, "Forbidden")
        _problem(submitter.get("/v1/approvals"), 403, "Forbidden")
        call = f"{turns_path(cid)}/{tid}/approvals/call-1"
        _problem(submitter.post(call, json={"decision": "approve"}), 403, "Forbidden")
        _problem(approver.post(turns_path(cid), json={"message": "x", "agent": "echo"}), 403,
                 "Forbidden")  # fmt: skip
        assert sorted(_keys_of(r, pool, cid)) == stored
        assert submitter.get(f"/v1/conversations/{cid}/messages").json()["total"] == 2


def test_a_prefix_key_works_inside_its_prefix(gateway: GatewayProcess) -> None:
    cid = _cid("tenant-a:user")
    with gateway.client("tenant") as tenant:
        tid = _submit(tenant, cid, "mine")
        assert _wait(tenant, cid, tid)["text"] == "seen: mine"


# -- submit, follow, results --------------------------------------------------------------
def test_submit_json_with_attachments_and_long_poll_the_result(gateway: GatewayProcess) -> None:
    png, pdf = tiny_png(), tiny_pdf("gateway")
    cid = _cid("json")
    message = {
        "content": [
            {"type": "text", "text": "look"},
            {"type": "image", "data": base64.b64encode(png).decode(), "mime_type": "image/png"},
            {"type": "file", "data": base64.b64encode(pdf).decode(),
             "mime_type": "application/pdf", "filename": "n.pdf"},
        ]
    }  # fmt: skip
    with gateway.client("submitter") as http:
        response = http.post(turns_path(cid), json={"message": message, "agent": "echo"})
        assert response.status_code == 202
        accepted = response.json()
        assert accepted["status"] == "queued"
        assert response.headers["location"] == accepted["links"]["self"]
        assert accepted["links"]["self"].endswith(f"{turns_path(cid)}/{accepted['turn_id']}")
        done = http.get(accepted["links"]["self"], params={"wait": 30}).json()
    files = f"image/png:None:{_digest(png)}, application/pdf:n.pdf:{_digest(pdf)}"
    assert done["status"] == "succeeded"
    assert done["text"] == f"seen: look files: {files}"
    assert done["agent"] == "echo" and done["finished_ms"] >= done["created_ms"]


def test_submit_multipart_upload(gateway: GatewayProcess) -> None:
    png, pdf = tiny_png(), tiny_pdf("multipart")
    cid = _cid("multipart")
    files = [("files", ("a.png", png, "image/png")), ("files", ("b.pdf", pdf, "application/pdf"))]
    with gateway.client("submitter") as http:
        response = http.post(turns_path(cid), data={"text": "upload", "agent": "echo"}, files=files)
        assert response.status_code == 202, response.text
        done = _wait(http, cid, response.json()["turn_id"])
    expected = f"image/png:None:{_digest(png)}, application/pdf:b.pdf:{_digest(pdf)}"
    assert done["text"] == f"seen: upload files: {expected}"


def test_history_window_and_token_budget_limit_what_the_model_sees(
    gateway: GatewayProcess,
) -> None:
    cid = _cid("window")
    with gateway.client("submitter") as http:
        for text in ("one", "two", "three"):
            accepted = http.post(turns_path(cid), json={"message": text, "agent": "echo"}).json()
            assert _wait(http, cid, accepted["turn_id"])["status"] == "succeeded"
        windowed = http.post(
            turns_path(cid), json={"message": "four", "agent": "echo", "keep_last_turns": 1}
        ).json()
        assert _wait(http, cid, windowed["turn_id"])["text"] == "seen: three | four"
        # A budget no previous turn fits in: only the new message is sent (multipart too).
        form = {"text": "five", "agent": "echo", "max_history_tokens": "1"}
        budget = http.post(turns_path(cid), data=form, files=[("files", ("a.png", tiny_png()))])
        assert budget.status_code == 202, budget.text
        assert _wait(http, cid, budget.json()["turn_id"])["text"].startswith("seen: five files:")
        refused = http.post(
            turns_path(cid), json={"message": "six", "agent": "echo", "max_history_tokens": 0}
        )
        assert refused.status_code == 422
        assert refused.headers["content-type"].startswith("application/problem+json")


def test_idempotency_key_header_returns_the_first_turn(gateway: GatewayProcess) -> None:
    cid = _cid("idem")
    with gateway.client("submitter") as http:
        headers = {"Idempotency-Key": "order-7"}
        body = {"message": "once", "agent": "echo"}
        first = http.post(turns_path(cid), json=body, headers=headers).json()["turn_id"]
        again = http.post(turns_path(cid), json=body, headers=headers).json()["turn_id"]
        assert first == again
        _wait(http, cid, first)
        assert http.get(f"/v1/conversations/{cid}/messages").json()["total"] == 2


def test_history_is_paged_and_a_conversation_can_be_deleted(gateway: GatewayProcess) -> None:
    cid = _cid("history")
    with gateway.client("admin") as http:
        for text in ["one", "two", "three"]:
            _wait(http, cid, _submit(http, cid, text))
        page = http.get(f"/v1/conversations/{cid}/messages", params={"offset": 2, "limit": 2})
        body = page.json()
        assert body["total"] == 6 and body["offset"] == 2
        assert [m["content"][0]["text"] for m in body["messages"]] == ["two", "seen: one | two"]
        last = http.get(f"/v1/conversations/{cid}/messages", params={"last_turns": 1}).json()
        assert [m["role"] for m in last["messages"]] == ["user", "assistant"]
        assert http.delete(f"/v1/conversations/{cid}").status_code == 204
        assert http.get(f"/v1/conversations/{cid}/messages").json()["total"] == 0


def test_turns_and_conversations_report_usage(gateway: GatewayProcess) -> None:
    cid = _cid("usage")
    with gateway.client("admin") as http:
        turn = _wait(http, cid, _submit(http, cid, "look it up", agent="metered"))
        assert turn["finish_reason"] == "stop"
        usage = turn["usage"]
        assert isinstance(usage, dict)
        assert (usage["requests"], usage["prompt_tokens"], usage["cached_tokens"]) == (2, 230, 64)
        _wait(http, cid, _submit(http, cid, "again", agent="metered"))
        total = http.get(f"/v1/conversations/{cid}/usage").json()
        assert (total["requests"], total["total_tokens"]) == (4, 520)


# -- events -------------------------------------------------------------------------------
def _sse(response: httpx.Response) -> Iterator[tuple[str, str, dict[str, object]]]:
    """(id, event, data) of each event of an SSE response, as they arrive."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line == "":
            if "event" in fields:
                yield fields.get("id", ""), fields["event"], json.loads(fields.get("data", "{}"))
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


def test_sse_follows_a_turn_live_and_resumes_with_last_event_id(gateway: GatewayProcess) -> None:
    cid = _cid("sse")
    with gateway.client("admin") as http:
        tid = _submit(http, cid, "pay", agent="approver")
        seen: list[tuple[str, str, dict[str, object]]] = []
        with http.stream("GET", f"{turns_path(cid)}/{tid}/events") as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            for event in _sse(response):
                seen.append(event)
                if event[1] == "status" and event[2].get("status") == "awaiting_approval":
                    # Decided while the stream is open: the rest arrives on it.
                    call = http.get(f"{turns_path(cid)}/{tid}").json()["pending_approvals"][0]
                    url = f"{turns_path(cid)}/{tid}/approvals/{call['id']}"
                    assert http.post(url, json={"decision": "approve"}).status_code == 200
        assert seen[-1][1] == "done"
        types = [e[1] for e in seen]
        parked_at = next(i for i, e in enumerate(seen) if e[2].get("status") == "awaiting_approval")
        assert "approval_required" in types[:parked_at]
        assert "tool_result" in types[parked_at:]  # arrived on the stream left open
        assert len({e[0] for e in seen}) == len(seen)  # every event has its own id
        # A reader that dropped after the first events resumes exactly after them.
        cut = 2
        headers = {"Last-Event-ID": seen[cut - 1][0]}
        with http.stream("GET", f"{turns_path(cid)}/{tid}/events", headers=headers) as response:
            rest = list(_sse(response))
        assert rest == seen[cut:]
        with http.stream("GET", f"{turns_path(cid)}/{tid}/events", params={"after": "0"}) as again:
            assert list(_sse(again)) == seen
        bad = http.get(f"{turns_path(cid)}/{tid}/events", headers={"Last-Event-ID": "x; drop"})
        _problem(bad, 422, "InvalidEventId")


# -- approvals, cancel, discard -----------------------------------------------------------
def test_approve_over_http_resumes_the_turn(gateway: GatewayProcess) -> None:
    cid = _cid("approve")
    with gateway.client("submitter") as http, gateway.client("approver") as approver:
        tid = _submit(http, cid, "pay", agent="approver")
        parked = _wait(http, cid, tid)
        assert parked["status"] == "awaiting_approval"
        calls = parked["pending_approvals"]
        assert isinstance(calls, list) and calls[0]["name"] == "transfer"
        inbox = approver.get("/v1/approvals").json()
        mine = [t for t in inbox["turns"] if t["turn_id"] == tid]
        assert mine and mine[0]["agent"] == "approver" and mine[0]["conversation_id"] == cid
        assert mine[0]["pending_approvals"][0]["arguments"] == {"amount": 5}
        assert mine[0]["expires_ms"] > inbox["now_ms"]
        with gateway.client("tenant") as tenant:  # approve scope, another prefix: not listed
            assert tid not in [t["turn_id"] for t in tenant.get("/v1/approvals").json()["turns"]]
        url = f"{turns_path(cid)}/{tid}/approvals/{calls[0]['id']}"
        decided = approver.post(url, json={"decision": "approve"})
        assert decided.status_code == 200 and decided.json()["outcome"] == "resume"
        done = _wait(http, cid, tid, until="final")
        assert done["status"] == "succeeded"
        assert str(done["text"]).startswith("after tool: transferred 5")
        assert tid not in [t["turn_id"] for t in approver.get("/v1/approvals").json()["turns"]]
        # Deciding again differently is refused: 409 with the protocol's error.
        again = approver.post(url, json={"decision": "deny"})
        assert _problem(again, 409, "ProtocolError")["error"]["type"] == "ProtocolError"


def test_deny_with_a_reason_and_discard_and_cancel(gateway: GatewayProcess) -> None:
    with gateway.client("admin") as http:
        cid = _cid("deny")
        tid = _submit(http, cid, "pay", agent="approver")
        call = _wait(http, cid, tid)["pending_approvals"][0]["id"]  # type: ignore[index]
        url = f"{turns_path(cid)}/{tid}/approvals/{call}"
        http.post(url, json={"decision": "deny", "reason": "too much"})
        text = str(_wait(http, cid, tid, until="final")["text"])
        assert "denied" in text and "too much" in text

        cid = _cid("discard")
        tid = _submit(http, cid, "pay", agent="approver")
        assert _wait(http, cid, tid)["status"] == "awaiting_approval"
        assert http.post(f"{turns_path(cid)}/{tid}/discard").status_code == 204
        assert http.get(f"{turns_path(cid)}/{tid}").json()["status"] == "cancelled"

        cid = _cid("cancel")
        tid = _submit(http, cid, "pay", agent="approver")
        assert _wait(http, cid, tid)["status"] == "awaiting_approval"
        assert http.post(f"{turns_path(cid)}/{tid}/cancel").json() == {"outcome": "cancelled"}
        assert http.post(f"{turns_path(cid)}/{tid}/cancel").json() == {"outcome": "finished"}
        cancelled = http.get(f"{turns_path(cid)}/{tid}").json()
        assert cancelled["status"] == "cancelled"
        assert cancelled["error"]["type"] == "TurnCancelledError"


# -- errors -------------------------------------------------------------------------------
def test_errors_are_problem_json_carrying_the_convoq_error(
    gateway: GatewayProcess, pool: WorkerPool, r: redis.Redis
) -> None:
    cid = _cid("errors")
    with gateway.client("admin") as http:
        missing = http.get(f"{turns_path(cid)}/{uuid.uuid4().hex}")
        assert _problem(missing, 404, "UnknownTurnError")["error"]["type"] == "UnknownTurnError"
        unknown = http.post(turns_path(cid), json={"message": "hi", "agent": "nobody"})
        body = _problem(unknown, 422, "UnknownAgentError")
        assert "echo" in body["error"]["details"]["known"]
        hook = http.post(turns_path(cid), json={"message": "hi", "agent": "echo",
                                            "callback_url": "http://127.0.0.1:9/h"})  # fmt: skip
        refused = _problem(hook, 422, "InvalidCallbackUrlError")
        assert refused["error"]["details"]["address_class"] == "loopback"
        as_json = {"Content-Type": "application/json"}
        bad = http.post(turns_path(cid), content=b"{not json", headers=as_json)
        _problem(bad, 422, "ValidationError")
        _problem(http.post(turns_path(cid), json={"agent": "echo"}), 422, "ValidationError")
        _problem(http.post(turns_path(cid), content=b"hi", headers={"Content-Type": "text/plain"}),
                 415, "UnsupportedMediaType")  # fmt: skip
        empty = http.post(turns_path(cid), json={"message": {"content": []}, "agent": "echo"})
        _problem(empty, 422, "ValidationError")  # the schema needs at least one part
        assert _keys_of(r, pool, cid) == []

        parked = _submit(http, cid, "pay", agent="approver")
        assert _wait(http, cid, parked)["status"] == "awaiting_approval"
        busy = http.post(
            turns_path(cid), json={"message": "x", "agent": "echo", "if_busy": "reject"}
        )
        _problem(busy, 409, "ConversationBusyError")
        _problem(http.delete(f"/v1/conversations/{cid}"), 409, "ConversationBusyError")
        http.post(f"{turns_path(cid)}/{parked}/discard")


def test_request_size_limit_is_413_and_nothing_is_written(
    gateway: GatewayProcess, pool: WorkerPool, r: redis.Redis
) -> None:
    cid = _cid("big")
    big = base64.b64encode(b"\x89PNG" + bytes(2 * MAX_TURN_BYTES)).decode()
    message = {"content": [{"type": "image", "data": big, "mime_type": "image/png"}]}
    with gateway.client("admin") as http:
        declared = http.post(turns_path(cid), json={"message": message, "agent": "echo"})
        _problem(declared, 413, "RequestTooLarge")

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            payload = json.dumps({"message": message, "agent": "echo"}).encode()
            for start in range(0, len(payload), 65536):
                yield payload[start : start + 65536]

        streamed = http.post(turns_path(cid), content=chunks(),
                             headers={"Content-Type": "application/json"})  # fmt: skip
        _problem(streamed, 413, "RequestTooLarge")
        # Under the body limit but over max_turn_bytes once decoded: the client's limit.
        small = base64.b64encode(b"\x89PNG" + bytes(MAX_TURN_BYTES // 2 + 10)).decode()
        two = [{"type": "image", "data": small, "mime_type": "image/png"}] * 2
        over = http.post(turns_path(cid), json={"message": {"content": two}, "agent": "echo"})
        assert _problem(over, 413, "InvalidMessageError")["error"]["details"]["limit"] == (
            MAX_TURN_BYTES
        )
    assert _keys_of(r, pool, cid) == []


# -- health and documents -----------------------------------------------------------------
def test_health_readiness_openapi_and_docs(gateway: GatewayProcess) -> None:
    assert httpx.get(f"{gateway.url}/healthz").json() == {"status": "ok", "detail": ""}
    assert httpx.get(f"{gateway.url}/readyz").json()["status"] == "ok"
    document = httpx.get(f"{gateway.url}/openapi.json").json()
    paths = document["paths"]
    # POST queues a turn; GET lists the conversation's turns (the console's).
    assert set(paths["/v1/conversations/{cid}/turns"]) == {"post", "get"}
    body = paths["/v1/conversations/{cid}/turns"]["post"]["requestBody"]["content"]
    assert {"application/json", "multipart/form-data"} <= set(body)
    assert "TurnRequest" in document["components"]["schemas"]
    assert "/v1/conversations/{cid}/turns/{tid}/events" in paths
    docs = httpx.get(f"{gateway.url}/docs")
    assert docs.status_code == 200 and "/v1/approvals" in docs.text


def test_readyz_is_503_when_the_broker_is_unreachable(pool: WorkerPool, tmp_path: Path) -> None:
    closed = f"redis://127.0.0.1:{_closed_port()}/0"
    with running_gateway(pool, tmp_path, broker_url=closed) as broken:
        response = httpx.get(f"{broken.url}/readyz", timeout=30)
    assert response.status_code == 503
    assert response.json()["status"] == "unavailable"
    assert "broker" in response.json()["detail"]


def _closed_port() -> int:
    from convoq._ports import free_loopback_port

    return free_loopback_port()


def test_events_until_settled_end_once_the_turn_is_parked(gateway: GatewayProcess) -> None:
    cid = _cid("settled")
    with gateway.client() as http:
        tid = _submit(http, cid, "send 7 to bob", agent="approver")
        events = f"{turns_path(cid)}/{tid}/events"
        # Bounded: the stream must end by itself long before this timeout.
        with http.stream("GET", events, params={"until": "settled"}, timeout=30) as sse:
            assert sse.status_code == 200
            lines = list(sse.iter_lines())
        kinds = [line[7:] for line in lines if line.startswith("event: ")]
        assert "approval_required" in kinds and "done" not in kinds, kinds
        data = [line for line in lines if line.startswith("data: ")]
        assert kinds[-1] == "status" and data[-1] == 'data: {"status":"awaiting_approval"}'

        assert _wait(http, cid, tid)["status"] == "awaiting_approval"


def test_the_document_links_a_submit_to_its_turn_and_a_turn_to_its_approvals(
    gateway: GatewayProcess,
) -> None:
    with gateway.client() as http:
        document = http.get("/openapi.json").json()
    operations = {
        op["operationId"]: path
        for path, ops in document["paths"].items()
        for op in ops.values()
        if "operationId" in op
    }
    turns = document["paths"]["/v1/conversations/{cid}/turns"]
    submit_links = turns["post"]["responses"]["202"]["links"]
    view = document["paths"]["/v1/conversations/{cid}/turns/{tid}"]["get"]["responses"]["200"]
    targets = {
        name: operations[link["operationId"]]
        for name, link in {**submit_links, **view["links"]}.items()
    }
    assert targets == {
        "Turn": "/v1/conversations/{cid}/turns/{tid}",
        "Events": "/v1/conversations/{cid}/turns/{tid}/events",
        "Cancel": "/v1/conversations/{cid}/turns/{tid}/cancel",
        "DecidePending": "/v1/conversations/{cid}/turns/{tid}/approvals/{call_id}",
        "Discard": "/v1/conversations/{cid}/turns/{tid}/discard",
        "Retry": "/v1/conversations/{cid}/turns/{tid}/retry",
    }
    decide = view["links"]["DecidePending"]["parameters"]
    assert decide["path.call_id"] == "$response.body#/pending_approvals/0/id"


def _linked_path(document: dict[str, Any], link: dict[str, Any], body: dict[str, Any]) -> str:
    """The path a link of ``document`` leads to from a response ``body``: each
    ``$response.body#/a/0/b`` parameter resolved as OpenAPI says (a JSON pointer)."""
    operation = next(
        path
        for path, ops in document["paths"].items()
        for op in ops.values()
        if op.get("operationId") == link["operationId"]
    )
    for name, expression in link["parameters"].items():
        if not name.startswith("path."):
            continue
        value: Any = body
        for step in expression.removeprefix("$response.body#/").split("/"):
            value = value[int(step)] if isinstance(value, list) else value[step]
        operation = operation.replace("{" + name.removeprefix("path.") + "}", quote(value, safe=""))
    return operation


def test_the_links_of_a_parked_and_of_a_failed_turn_lead_to_calls_that_go_through(
    gateway: GatewayProcess,
) -> None:
    """What the fuzzer's stateful phase reaches only when its random submits happen to
    name the agent that parks or the one that fails: followed here every time."""
    with gateway.client() as http:
        document = http.get("/openapi.json").json()
        view = document["paths"]["/v1/conversations/{cid}/turns/{tid}"]["get"]["responses"]
        links = view["200"]["links"]
        cid = f"links-{uuid.uuid4().hex[:8]}"

        parked = _wait(http, cid, _submit(http, cid, "pay", agent="approver"))
        assert parked["status"] == "awaiting_approval"
        decide = _linked_path(document, links["DecidePending"], parked)
        decided = http.post(decide, json={"decision": "approve"})
        assert decided.status_code == 200, decided.text
        assert _wait(http, cid, str(parked["turn_id"]), "final")["status"] == "succeeded"

        failed = _wait(http, cid, _submit(http, cid, "fail", agent="failer"), "final")
        assert failed["status"] == "failed"
        retried = http.post(_linked_path(document, links["Retry"], failed))
        assert retried.status_code == 202, retried.text
        assert retried.json()["turn_id"] == failed["turn_id"]
    # This deployment signs callbacks: the field is there and says what it needs.
    callback = document["components"]["schemas"]["TurnRequest"]["properties"]["callback_url"]
    assert "CONVOQ_WEBHOOK_SECRET" in callback["description"] and "not" not in callback


def test_without_a_signing_secret_the_document_refuses_callback_url(redis_url: str) -> None:
    from convoq.gateway.app import create_app
    from convoq.settings import ConvoqSettings

    app = create_app(ConvoqSettings.resolve(redis_url=redis_url, webhook_secret=None))
    document = app.openapi()
    json_field = document["components"]["schemas"]["TurnRequest"]["properties"]["callback_url"]
    submit = document["paths"]["/v1/conversations/{cid}/turns"]["post"]["requestBody"]
    form_field = submit["content"]["multipart/form-data"]["schema"]["properties"]["callback_url"]
    for field in (json_field, form_field):
        assert field["not"] == {} and "refused (422)" in field["description"]

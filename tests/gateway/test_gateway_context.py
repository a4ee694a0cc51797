"""Metadata and approval audit through the HTTP gateway (a real uvicorn process over a
real worker): metadata in JSON and multipart bodies (bad metadata is 422 with nothing
queued), decisions recorded with the API key's name or, for a key allowed to, the ``by``
it names; the turn view and the approvals inbox (in a headless browser) show who decided."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
import redis

from tests.support.browser import browser_fixture, page_fixture  # noqa: F401  (fixtures)
from tests.support.gateway import GatewayProcess, key_of, module_gateway, turns_path
from tests.support.workers import WorkerPool, module_pool

pytestmark = pytest.mark.slow

pool = module_pool(1)
gateway = module_gateway()


def _cid(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


def _wait(http: httpx.Client, cid: str, tid: str, until: str = "settled") -> dict[str, Any]:
    response = http.get(f"{turns_path(cid)}/{tid}", params={"wait": 30, "until": until})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _submit(http: httpx.Client, cid: str, agent: str, **extra: Any) -> str:
    response = http.post(turns_path(cid), json={"message": "pay", "agent": agent, **extra})
    assert response.status_code == 202, response.text
    return str(response.json()["turn_id"])


def test_metadata_in_a_json_body(gateway: GatewayProcess) -> None:
    cid = _cid("meta")
    with gateway.client("submitter") as http:
        tid = _submit(http, cid, "echo", metadata={"user": "ada", "n": [1, 2]})
        done = _wait(http, cid, tid, until="final")
        assert done["status"] == "succeeded" and done["metadata"] == {"user": "ada", "n": [1, 2]}


@pytest.mark.parametrize(
    "body",
    [
        {"json": {"message": "x", "agent": "echo", "metadata": [1]}},
        {"json": {"message": "x", "agent": "echo", "metadata": {"x": "y" * 20_000}}},
        # A form's metadata field holds a JSON object, or the upload is refused.
        {"data": {"agent": "echo", "text": "x", "metadata": "[1]"}},
        {"data": {"agent": "echo", "text": "x", "metadata": "{not json"}},
    ],
)
def test_bad_metadata_is_422_and_nothing_is_queued(
    gateway: GatewayProcess, pool: WorkerPool, r: redis.Redis, body: dict[str, Any]
) -> None:
    cid = _cid("badmeta")
    with gateway.client("submitter") as http:
        if "data" in body:
            files = {"files": ("a.txt", b"x", "text/plain")}
            response = http.post(turns_path(cid), data=body["data"], files=files)
        else:
            response = http.post(turns_path(cid), json=body["json"])
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert "metadata" in response.text
    assert list(r.scan_iter(match=f"{pool.prefix}:{{{cid}}}*")) == []


def test_a_decision_records_the_key_name_or_the_by_an_allowed_key_gives(
    gateway: GatewayProcess,
) -> None:
    cid = _cid("audit")
    with gateway.client("submitter") as http:
        tid = _submit(http, cid, "double_approver")
        calls = [c["id"] for c in _wait(http, cid, tid)["pending_approvals"]]
    assert calls == ["call-a", "call-b"]
    url = f"{turns_path(cid)}/{tid}/approvals"
    with gateway.client("approver") as approver, gateway.client("app") as app:
        refused = approver.post(f"{url}/call-a", json={"decision": "approve", "by": "mallory"})
        assert refused.status_code == 403 and "may not name" in refused.text
        first = approver.post(f"{url}/call-a", json={"decision": "approve"})
        assert first.status_code == 200, first.text
        assert first.json()["outcome"] == "pending"
        assert first.json()["decision"]["by"] == "approver"
        listed = [t for t in approver.get("/v1/approvals").json()["turns"] if t["turn_id"] == tid]
        assert listed[0]["decisions"]["call-a"]["by"] == "approver"
        body = {"decision": "deny", "reason": "twice is too much", "by": "alice@example.com"}
        second = app.post(f"{url}/call-b", json=body)
        assert second.json()["outcome"] == "resume"
        assert second.json()["decision"]["by"] == "alice@example.com"
        done = _wait(approver, cid, tid, until="final")
    assert done["status"] == "succeeded"
    assert "denied this tool call by alice@example.com: twice is too much" in done["text"]
    decisions = done["decisions"]
    assert (decisions["call-a"]["approved"], decisions["call-a"]["by"]) == (True, "approver")
    assert decisions["call-b"]["by"] == "alice@example.com" and decisions["call-b"]["at_ms"]


def test_the_inbox_page_shows_who_decided_a_call(page: Any, gateway: GatewayProcess) -> None:
    cid = _cid("inbox-audit")
    with gateway.client("submitter") as http:
        tid = _submit(http, cid, "double_approver")
        assert _wait(http, cid, tid)["status"] == "awaiting_approval"
    page.goto(f"{gateway.url}/inbox#key={key_of('approver')}")
    item = page.locator(f'li.turn[data-turn-id="{tid}"]')
    item.wait_for(state="visible")
    item.locator('.call[data-call-id="call-a"] button.approve').click()
    outcome = page.locator("#outcome")
    outcome.filter(has_text="as approver").wait_for()
    assert "the turn waits for its other calls" in (outcome.text_content() or "")
    decided = page.locator(f'li.turn[data-turn-id="{tid}"] .call[data-call-id="call-a"] .decided')
    decided.wait_for(state="visible")
    assert (decided.text_content() or "").startswith("approved by approver at ")
    with gateway.client("approver") as approver:
        approver.delete(f"{turns_path(cid)}/{tid}")

"""A Pydantic AI profile behind the HTTP gateway (a real uvicorn process over real
workers), unchanged: submit, the approvals list, a denial with its reason, the result."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote

import pytest

from tests.support.gateway import GatewayProcess, module_gateway
from tests.support.workers import module_pool

pytestmark = pytest.mark.slow

pool = module_pool(1, agents="tests.support.pydantic_ai_agents")
gateway = module_gateway()


def _turns(cid: str) -> str:
    return f"/v1/conversations/{quote(cid, safe='')}/turns"


def test_a_denial_over_http_resumes_the_pydantic_ai_run_with_its_reason(
    gateway: GatewayProcess,
) -> None:
    token = f"g{uuid.uuid4().hex[:8]}"
    cid = f"pai-{token}"
    with gateway.client("submitter") as http:
        body = {"message": f"{token} pay", "agent": "pai-payer"}
        submitted = http.post(_turns(cid), json=body)
        assert submitted.status_code == 202, submitted.text
        tid = submitted.json()["turn_id"]
        parked = http.get(f"{_turns(cid)}/{tid}", params={"wait": 30, "until": "settled"}).json()
    assert parked["status"] == "awaiting_approval"
    [call] = parked["pending_approvals"]
    assert call["name"] == "pay"
    with gateway.client("approver") as approver:
        listed = [t for t in approver.get("/v1/approvals").json()["turns"] if t["turn_id"] == tid]
        assert [c["id"] for c in listed[0]["pending_approvals"]] == [call["id"]]
        url = f"{_turns(cid)}/{tid}/approvals/{call['id']}"
        denied = approver.post(url, json={"decision": "deny", "reason": "not now"})
        assert denied.json()["outcome"] == "resume", denied.text
        done: dict[str, Any] = approver.get(
            f"{_turns(cid)}/{tid}", params={"wait": 30, "until": "final"}
        ).json()
    assert done["status"] == "succeeded"
    refusal = (
        "The user denied this tool call by approver: not now. It did not run; do not retry it."
    )
    assert done["text"] == f"found {refusal} noted"
    assert done["decisions"][call["id"]]["by"] == "approver"

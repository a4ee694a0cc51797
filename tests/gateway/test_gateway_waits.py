"""Waits for the world through a real gateway process: a deferred call's result and a
signal posted over HTTP resume the turn; the turn view says what it waits for; the
approvals inbox does not offer the call; scopes, tenant prefixes and bad bodies are
refused as problem+json with nothing written."""

from __future__ import annotations

import time
import uuid

import httpx

from tests.support.gateway import GatewayProcess, module_gateway, turns_path
from tests.support.workers import module_pool

pool = module_pool(1, agents="tests.support.world_agents")
gateway = module_gateway()


def _waiting(http: httpx.Client, cid: str, tid: str) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        view: dict[str, object] = http.get(f"{turns_path(cid)}/{tid}").json()
        if view["status"] == "waiting":
            return view
        time.sleep(0.1)
    raise AssertionError(f"{cid}/{tid} did not park")


def _submit(http: httpx.Client, cid: str, text: str) -> str:
    response = http.post(turns_path(cid), json={"message": text, "agent": "courier"})
    assert response.status_code == 202, response.text
    return str(response.json()["turn_id"])


def _problem(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, object] = response.json()
    return body


def test_a_result_posted_over_http_resumes_the_turn(gateway: GatewayProcess) -> None:
    order = f"o{uuid.uuid4().hex[:8]}"
    cid = f"tenant-a:{order}"
    with gateway.client("tenant") as http:
        tid = _submit(http, cid, f"ship {order}")
        view = _waiting(http, cid, tid)
        assert view["pending_approvals"] == []
        assert view["waiting_for"] == [{
            "call_id": f"ship-{order}", "name": "ship", "on": "result", "signal": None,
            "timeout_s": None, "metadata": {"order": order},
        }]  # fmt: skip
        inbox = http.get("/v1/approvals").json()
        assert tid not in [t["turn_id"] for t in inbox["turns"]]
        url = f"{turns_path(cid)}/{tid}/calls/ship-{order}/result"
        # Bad bodies and a key without the scope are refused; nothing is recorded.
        _problem(http.post(url, json={"result": 1, "error": "both"}), 422)
        _problem(http.post(url, json={"result": 1, "extra": True}), 422)
        with gateway.client("reader") as reader:
            _problem(reader.post(url, json={"result": 1}), 403)
        # Outside the key's conversation prefix: refused before anything is read.
        _problem(http.post(f"{turns_path('b:' + order)}/{tid}/calls/x/result", json={}), 403)
        _problem(http.post(f"/v1/conversations/b:{order}/signals", json={"name": "n"}), 403)
        assert http.get(f"{turns_path(cid)}/{tid}").json()["status"] == "waiting"
        first = http.post(url, json={"result": {"tracking": "T9"}})
        assert first.status_code == 200, first.text
        assert first.json()["outcome"] == "resume"
        assert http.post(url, json={"result": {"tracking": "T9"}}).json()["outcome"] == "resume"
        _problem(http.post(url, json={"result": "another"}), 409)
        done = http.get(f"{turns_path(cid)}/{tid}", params={"wait": 30}).json()
    assert done["status"] == "succeeded" and done["text"] == 'done: {"tracking":"T9"}'
    assert done["decisions"][f"ship-{order}"]["by"] == "tenant"


def test_a_signal_posted_over_http_wakes_the_waiting_turn(gateway: GatewayProcess) -> None:
    order = f"o{uuid.uuid4().hex[:8]}"
    cid = f"pay-{order}"
    with gateway.client("submitter") as http:
        tid = _submit(http, cid, f"pay {order}")
        view = _waiting(http, cid, tid)
        assert [(w["on"], w["signal"]) for w in view["waiting_for"]] == [("signal", "paid")]  # type: ignore[index, union-attr]
        signals = f"/v1/conversations/{cid}/signals"
        _problem(http.post(signals, json={"name": "", "payload": 1}), 422)
        sent = http.post(signals, json={"name": "paid", "payload": {"ok": True}, "signal_id": "e1"})
        assert sent.status_code == 200, sent.text
        assert sent.json() == {
            "outcome": "delivered", "turn_id": tid, "call_id": f"await_payment-{order}",
            "resume": True, "kept": 0,
        }  # fmt: skip
        again = http.post(
            signals, json={"name": "paid", "payload": {"ok": True}, "signal_id": "e1"}
        )
        assert again.json()["outcome"] == "duplicate"
        done = http.get(f"{turns_path(cid)}/{tid}", params={"wait": 30}).json()
        assert done["text"] == 'done: {"ok":true}'
        kept = http.post(signals, json={"name": "paid", "payload": 2})
        assert kept.json()["outcome"] == "kept" and kept.json()["kept"] == 1


def test_a_person_is_offered_only_the_call_a_person_decides(gateway: GatewayProcess) -> None:
    order = f"o{uuid.uuid4().hex[:8]}"
    cid = f"mixed-{order}"
    with gateway.client("admin") as http:
        tid = _submit(http, cid, f"return {order}")
        deadline = time.monotonic() + 60
        while http.get(f"{turns_path(cid)}/{tid}").json()["status"] != "awaiting_approval":
            assert time.monotonic() < deadline, "the turn did not park"
            time.sleep(0.1)
        view = http.get(f"{turns_path(cid)}/{tid}").json()
        assert [c["id"] for c in view["pending_approvals"]] == [f"refund-{order}"]
        assert [w["call_id"] for w in view["waiting_for"]] == [f"ship-{order}"]
        inbox = [t for t in http.get("/v1/approvals").json()["turns"] if t["turn_id"] == tid]
        assert [c["id"] for c in inbox[0]["pending_approvals"]] == [f"refund-{order}"]
        detail = http.get(f"{turns_path(cid)}/{tid}/timeline").json()
        assert [c["id"] for c in detail["pending_approvals"]] == [f"refund-{order}"]
        approve = f"{turns_path(cid)}/{tid}/approvals"
        _problem(http.post(f"{approve}/ship-{order}", json={"decision": "approve"}), 409)
        assert (
            http.post(f"{approve}/refund-{order}", json={"decision": "approve"}).json()["outcome"]
            == "pending"
        )  # the shipment's result is still missing
        result = f"{turns_path(cid)}/{tid}/calls/ship-{order}/result"
        assert http.post(result, json={"result": "shipped"}).json()["outcome"] == "resume"
        done = http.get(f"{turns_path(cid)}/{tid}", params={"wait": 30}).json()
    assert done["text"] == f"done: shipped | refunded {order}"

"""The console's JSON routes against a real gateway over real workers: the key's own
scopes, conversations found by prefix, a conversation's overview, transcript (newest
first, attachments by reference and their bytes), turns, a turn's timeline (model calls,
tool calls rerun after a takeover with their idempotency key and workers, approvals,
errors), the workers and the backlog per partition; and a tenant-scoped key that reaches
only its prefix on every one of them."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis

from tests.support import console_scene
from tests.support.console_scene import PDF, PNG, Scene
from tests.support.gateway import GatewayProcess, module_gateway
from tests.support.workers import WorkerPool, module_pool, wait_until

pytestmark = pytest.mark.slow

pool = module_pool(2, **console_scene.POOL_SETTINGS)
# The scripted model's price, US dollars per million tokens (what the cost rows use).
PRICES = {"scripted": {"input": 2.0, "output": 8.0, "cached_input": 1.0}}
gateway = module_gateway(MODEL_PRICES=json.dumps(PRICES))


@pytest.fixture(scope="module")
def scene(gateway: GatewayProcess, pool: WorkerPool) -> Scene:
    return console_scene.build(gateway, pool)


@pytest.fixture(scope="module")
def admin(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with gateway.client("admin") as http:
        yield http


def _c(cid: str) -> str:
    return f"/v1/conversations/{quote(cid, safe='')}"


def _usd(usage: dict[str, int]) -> float:
    """What ``usage`` costs at the scripted model's PRICES (cached prompt tokens cheaper)."""
    price = PRICES["scripted"]
    cached = usage["cached_tokens"]
    spent = (usage["prompt_tokens"] - cached) * price["input"] + cached * price["cached_input"]
    return (spent + usage["completion_tokens"] * price["output"]) / 1e6


def _get(http: httpx.Client, path: str, **params: Any) -> Any:
    response = http.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_key_route_says_what_the_calling_key_may_do(gateway: GatewayProcess) -> None:
    with gateway.client("tenant") as http:
        assert _get(http, "/v1/key") == {
            "name": "tenant",
            "scopes": ["approve", "read", "submit"],
            "conversation_prefix": "tenant-a:",
            "may_set_by": False,
        }
    with gateway.client("scraper") as http:  # any known key, whatever its scopes
        assert _get(http, "/v1/key")["scopes"] == ["metrics"]
    with gateway.client(None) as http:
        assert http.get("/v1/key").status_code == 401


def test_conversations_are_found_by_prefix_with_what_waits_and_their_latest_turn(
    admin: httpx.Client, scene: Scene
) -> None:
    listed = _get(admin, "/v1/conversations", prefix="console-", limit=200)
    assert listed["complete"] is True
    rows = {r["conversation_id"]: r for r in listed["conversations"]}
    assert {scene.images, scene.parked, scene.failed, scene.taken, scene.xss} <= set(rows)
    parked = rows[scene.parked]
    assert (parked["parked"], parked["running"], parked["queued"]) == (True, False, 0)
    assert parked["latest_turn"]["turn_id"] == scene.parked_tid
    assert parked["latest_turn"]["status"] == "awaiting_approval"
    assert parked["stored_turns"] == 1 and parked["activity_ms"] > 0
    assert rows[scene.failed]["latest_turn"]["status"] == "failed"
    assert rows[scene.failed]["latest_turn"]["error"]["type"] == "ModelError"
    assert rows[scene.taken]["latest_turn"]["attempts"] == 2
    # The newest turn first: turn ids carry their creation time.
    latest = [r["latest_turn"]["turn_id"] for r in listed["conversations"] if r["latest_turn"]]
    assert latest == sorted(latest, reverse=True)

    one = _get(admin, "/v1/conversations", prefix=scene.images)
    assert [r["conversation_id"] for r in one["conversations"]] == [scene.images]
    assert one["found"] == 1
    limited = _get(admin, "/v1/conversations", prefix="console-", limit=2)
    assert len(limited["conversations"]) == 2 and limited["found"] >= 5


def test_a_conversation_overview_has_its_summary_usage_inbox_and_lease(
    admin: httpx.Client, scene: Scene
) -> None:
    summarised = _get(admin, _c(scene.summarised))
    assert summarised["stored_turns"] == 3
    # The compacting profile keeps the last turn as it is and summarises those before.
    assert summarised["summary"]["text"].endswith("users said summary turn one, summary turn two")
    assert summarised["summary"]["watermark"] == 2
    parked = _get(admin, _c(scene.parked))
    assert parked["lease"]["state"] == "parked"
    assert [t["turn_id"] for t in parked["inbox"]] == [scene.parked_tid]
    assert parked["inbox"][0]["status"] == "awaiting_approval"
    assert parked["usage"]["requests"] == 1  # the stored turn's answer (ANSWER_USAGE)
    assert parked["usage"]["total_tokens"] == 69
    # Every answer came from the scripted model: its usage is all of it, priced.
    assert parked["usage_by_model"] == {"scripted": parked["usage"]}
    assert parked["cost"] == {"usd": pytest.approx(_usd(parked["usage"])),
                              "by_model": {"scripted": pytest.approx(_usd(parked["usage"]))},
                              "unpriced": []}  # fmt: skip
    empty = _get(admin, _c(f"console-nothing-{uuid.uuid4().hex[:6]}"))
    assert (empty["stored_turns"], empty["inbox"], empty["lease"]) == (0, [], None)


def test_the_transcript_names_attachments_and_serves_their_bytes(
    admin: httpx.Client, scene: Scene
) -> None:
    response = admin.get(f"{_c(scene.images)}/transcript")
    page = response.json()
    assert (page["total"], page["next_before"]) == (1, None)
    [turn] = page["turns"]
    user, answer = turn["messages"]
    assert user["role"] == "user" and answer["role"] == "assistant"
    text, image, pdf = user["content"]
    assert text == {"type": "text", "text": "what is in these?"}
    assert image == {"type": "image", "mime_type": "image/png", "filename": None,
                     "sha256": hashlib.sha256(PNG).hexdigest(), "size": len(PNG)}  # fmt: skip
    assert (pdf["filename"], pdf["size"]) == ("receipt.pdf", len(PDF))
    assert len(response.content) < 2000  # named, never carried
    for part, data in ((image, PNG), (pdf, PDF)):
        got = admin.get(f"{_c(scene.images)}/attachments/{part['sha256']}")
        assert got.status_code == 200 and got.content == data
        assert got.headers["content-type"] == "application/octet-stream"
        assert got.headers["content-disposition"].startswith("attachment")
        assert got.headers["x-content-type-options"] == "nosniff"
    unknown = admin.get(f"{_c(scene.images)}/attachments/{'0' * 64}")
    assert unknown.status_code == 404
    assert admin.get(f"{_c(scene.images)}/attachments/not-a-digest").status_code == 422
    # Another conversation's attachment is not reachable through this one.
    other = admin.get(f"{_c(scene.parked)}/attachments/{image['sha256']}")
    assert other.status_code == 404


def test_the_transcript_pages_newest_first_to_the_start(admin: httpx.Client, scene: Scene) -> None:
    seen: list[str] = []
    before: int | None = None
    while True:
        params = {"limit": 1, **({"before": before} if before else {})}
        page = _get(admin, f"{_c(scene.summarised)}/transcript", **params)
        seen += [t["messages"][0]["content"][0]["text"] for t in page["turns"]]
        before = page["next_before"]
        if before is None:
            break
    assert seen == ["summary turn three", "summary turn two", "summary turn one"]


def test_turns_page_newest_first(admin: httpx.Client, scene: Scene) -> None:
    turns = _get(admin, f"{_c(scene.parked)}/turns")
    assert turns["total"] == 2 and turns["complete"] is True
    assert [t["status"] for t in turns["turns"]] == ["awaiting_approval", "succeeded"]
    first = _get(admin, f"{_c(scene.parked)}/turns", limit=1)
    assert first["turns"][0]["turn_id"] == scene.parked_tid
    rest = _get(admin, f"{_c(scene.parked)}/turns", limit=1, before=first["next_before"])
    assert [t["status"] for t in rest["turns"]] == ["succeeded"] and rest["next_before"] is None


def _steps(http: httpx.Client, cid: str, tid: str) -> dict[str, Any]:
    detail: dict[str, Any] = _get(http, f"{_c(cid)}/turns/{tid}/timeline")
    return detail


def test_a_takeover_shows_in_the_timeline_with_the_rerun_and_its_key(
    admin: httpx.Client, scene: Scene, pool: WorkerPool, r: redis.Redis
) -> None:
    detail = _steps(admin, scene.taken, scene.taken_tid)
    kinds = [s["kind"] for s in detail["steps"]]
    # The run taken over goes on from its journal: the model call is not made again, the
    # tool call cut off is (the same step: one row, two runs).
    assert kinds == ["status", "run", "model_call", "tool_call", "resumed", "model_call",
                     "status"]  # fmt: skip
    first_call, tool, resumed, second_call = (detail["steps"][i] for i in (2, 3, 4, 5))
    assert resumed["reason"] == "worker_lost" and resumed["attempt"] == 2
    assert (first_call["model"], first_call["finish_reason"]) == ("scripted", "tool_calls")
    assert isinstance(first_call["latency_ms"], int) and first_call["usage"]["total_tokens"] == 15
    assert (tool["name"], tool["arguments"], tool["runs"]) == ("step", {"text": "the long step"}, 2)
    assert tool["result"] == "stepped the long step"
    # The key both runs of the tool saw, and the pids they ran in: the second run's worker
    # is the one the timeline names.
    pids = r.lrange(f"{pool.prefix}:test:step:{tool['idempotency_key']}", 0, -1)
    assert len(pids) == 2 and pids[0] != pids[1]
    assert tool["worker"].endswith(f":{pids[1].decode()}")
    assert first_call["worker"].endswith(f":{pids[0].decode()}")
    assert second_call["worker"] == tool["worker"]
    assert second_call["text"] == "done: stepped the long step"
    assert detail["status"] == "succeeded" and detail["attempts"] == 2
    # Each call priced at the scripted model's price; the turn's cost is their sum.
    each = _usd(first_call["usage"])
    assert each == pytest.approx((12 * 2.0 + 3 * 8.0) / 1e6)
    assert first_call["cost_usd"] == pytest.approx(each) == second_call["cost_usd"]
    assert detail["cost"]["usd"] == pytest.approx(2 * each)


def test_a_parent_turn_links_its_child_turns_and_a_child_its_parent_call(
    admin: httpx.Client, scene: Scene
) -> None:
    parent = _steps(admin, scene.family, scene.family_tid)
    assert parent["parent"] is None
    [child] = parent["children"]
    assert (child["call_id"], child["agent"], child["status"]) == (
        "ask-helper",
        "helper",
        "succeeded",
    )
    assert child["usage"]["requests"] == 1
    assert parent["text"] == "the helper said: helped with find the receipt"
    seen = _steps(admin, child["conversation_id"], child["turn_id"])
    assert seen["parent"] == {"conversation_id": scene.family, "turn_id": scene.family_tid,
                              "call_id": "ask-helper", "depth": 1}  # fmt: skip
    assert seen["children"] == [] and seen["input_text"] == "find the receipt"


def test_a_handoff_shows_in_the_timeline_between_the_two_agents_calls(
    admin: httpx.Client, scene: Scene
) -> None:
    detail = _steps(admin, scene.handed, scene.handed_tid)
    kinds = [s["kind"] for s in detail["steps"] if s["kind"] != "status"]
    assert kinds == ["run", "model_call", "tool_call", "handoff", "model_call"]
    handoff = next(s for s in detail["steps"] if s["kind"] == "handoff")
    assert (handoff["call_id"], handoff["from_agent"], handoff["to_agent"]) == (
        "to-desk", "front", "desk",
    )  # fmt: skip
    assert detail["text"] == "desk here: my invoice"


def test_a_failed_turn_shows_its_error(admin: httpx.Client, scene: Scene) -> None:
    detail = _steps(admin, scene.failed, scene.failed_tid)
    error = detail["steps"][-1]
    assert error["kind"] == "error" and error["type"] == "ModelError"
    assert "failed on purpose" in error["message"]
    assert detail["error"]["type"] == "ModelError"


def test_an_approval_shows_asked_then_decided_by_whom_when_and_why(
    gateway: GatewayProcess, admin: httpx.Client, scene: Scene
) -> None:
    detail = _steps(admin, scene.parked, scene.parked_tid)
    assert detail["metadata"] == {"customer": "Ada Lovelace", "order": "A-7", "cents": 700}
    assert [c["name"] for c in detail["pending_approvals"]] == ["refund"]
    [asked] = [s for s in detail["steps"] if s["kind"] == "approval"]
    assert asked["arguments"] == {"amount": 7, "order": "A-7"} and asked["decision"] is None
    call_id = asked["call_id"]
    with gateway.client("approver") as http:
        decided = http.post(f"{_c(scene.parked)}/turns/{scene.parked_tid}/approvals/{call_id}",
                            json={"decision": "approve", "reason": "receipt checked"})  # fmt: skip
        assert decided.status_code == 200, decided.text
    console_scene.settled(gateway, scene.parked, scene.parked_tid, "final")
    after = _steps(admin, scene.parked, scene.parked_tid)
    [asked] = [s for s in after["steps"] if s["kind"] == "approval"]
    decision = asked["decision"]
    assert (decision["approved"], decision["by"], decision["reason"]) == (
        True, "approver", "receipt checked",
    )  # fmt: skip
    assert decision["at_ms"] >= asked["at_ms"]
    assert [s["kind"] for s in after["steps"]][-4:] == ["resumed", "tool_call", "model_call",
                                                       "status"]  # fmt: skip


def test_the_workers_show_slots_in_use_and_the_backlog_per_partition(
    admin: httpx.Client, client: Any, pool: WorkerPool, r: redis.Redis, scene: Scene
) -> None:
    word = f"hold{uuid.uuid4().hex[:6]}"
    cid = f"console-busy-{word}"
    running = client.submit(cid, f"{word} first", agent="blocker")
    client.submit(cid, f"{word} second", agent="blocker")

    def busy() -> dict[str, Any] | None:
        seen: dict[str, Any] = _get(admin, "/v1/workers")
        return seen if any(w["running"] for w in seen["workers"]) else None

    try:
        seen = wait_until(busy, 30, what="a worker running the blocker turn")
        [holder] = [w for w in seen["workers"] if w["running"]]
        assert holder["alive"] and holder["running"] == 1 and holder["concurrency"] == 8
        assert "taker" in holder["agents"] and holder["queues"]
        assert holder["worker_id"].endswith(f":{holder['pid']}")
        [part] = [p for p in seen["partitions"] if p["running"]]
        assert (part["running"], part["queued"]) == (1, 1)
        assert part["queue"] == f"{pool.prefix}.p{part['partition']}"
        assert sum(p["parked"] for p in seen["partitions"]) >= 1  # the scene's approvals
        assert seen["elsewhere"] == 0 and seen["complete"] is True
    finally:
        r.set(f"{pool.prefix}:test:release:{word}", "1")
    assert running.wait(30).text.startswith("released")


def test_a_tenant_key_reaches_only_its_prefix_on_every_console_route(
    gateway: GatewayProcess, admin: httpx.Client, scene: Scene
) -> None:
    with gateway.client("tenant") as http:
        listed = _get(http, "/v1/conversations")
        ids = [r["conversation_id"] for r in listed["conversations"]]
        assert scene.tenant in ids and all(i.startswith("tenant-a:") for i in ids)
        assert _get(http, "/v1/conversations", prefix="console-")["conversations"] == []
        narrowed = _get(http, "/v1/conversations", prefix="tenant-a:console")
        assert scene.tenant in [r["conversation_id"] for r in narrowed["conversations"]]
        sha = hashlib.sha256(PNG).hexdigest()
        outside = [
            _c(scene.images), f"{_c(scene.images)}/transcript",
            f"{_c(scene.images)}/attachments/{sha}", f"{_c(scene.images)}/turns",
            f"{_c(scene.images)}/turns/{scene.images_tid}/timeline",
        ]  # fmt: skip
        for path in outside:
            assert http.get(path).status_code == 403, path
        own = _get(http, f"{_c(scene.tenant)}/transcript")
        assert own["turns"][0]["messages"][0]["content"][0]["text"].startswith("tenant hello")
        tenant_view = _get(http, "/v1/workers")
    everyone = _get(admin, "/v1/workers")
    # The scene's parked approvals are outside the tenant's prefix: not in its counts.
    assert sum(p["parked"] for p in everyone["partitions"]) >= 1
    assert sum(p["parked"] + p["queued"] + p["running"] for p in tenant_view["partitions"]) == 0
    assert [w["name"] for w in tenant_view["workers"]] == [w["name"] for w in everyone["workers"]]


def test_the_console_routes_are_in_the_document_with_their_scopes(
    gateway: GatewayProcess,
) -> None:
    paths = httpx.get(f"{gateway.url}/openapi.json").json()["paths"]
    for path in ["/v1/key", "/v1/conversations", "/v1/conversations/{cid}",
                 "/v1/conversations/{cid}/transcript",
                 "/v1/conversations/{cid}/attachments/{sha256}",
                 "/v1/conversations/{cid}/turns/{tid}/timeline", "/v1/workers"]:  # fmt: skip
        operation = paths[path]["get"]
        assert "console" in operation["tags"]
        assert "scope" in operation["summary"], path
    assert "get" in paths["/v1/conversations/{cid}/turns"]


def test_the_console_loads_nothing_from_elsewhere(gateway: GatewayProcess) -> None:
    page = httpx.get(f"{gateway.url}/console")
    assert page.status_code == 200
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self';" in policy
    assert "unsafe" not in policy and "img-src 'self' blob:" in policy
    files = re.findall(r'(?:src|href)="(/console/[^"]+)"', page.text)
    assert len(files) == 5  # its scripts, its stylesheet and its icon: all of this origin
    assert "http" not in page.text.split("<body>", 1)[1]
    for name in files:
        served = httpx.get(f"{gateway.url}{name}")
        assert served.status_code == 200 and served.headers["content-security-policy"] == policy
        if name.endswith((".js", ".css")):
            assert "innerHTML" not in served.text and "http" not in served.text, name
    assert httpx.get(f"{gateway.url}/console/app.py").status_code == 404

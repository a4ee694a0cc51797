"""The conversations the console tests look at, made once per module on real workers
through a real gateway: images and a PDF, an approval parked on a refund with whose it
is in its metadata, a failed turn, a turn whose worker was killed mid-tool (taken over
by another worker), a summarised conversation, markup in ids, messages, metadata and
tool arguments, and a conversation of the tenant key's prefix."""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from convoq.cli.demo import tiny_pdf, tiny_png
from tests.support.gateway import GatewayProcess, turns_path
from tests.support.workers import WorkerPool, wait_until

AGENTS = "tests.support.worker_agents,tests.support.approval_agents,tests.support.console_agents"
# A worker killed mid-turn loses its lease in lease_ms; another one's sweeper re-kicks the
# conversation within a sweep period.
POOL_SETTINGS: dict[str, Any] = {"agents": AGENTS, "lease_ms": 3000, "sweep_interval_s": 1.0}
XSS = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'
# An id cannot hold "/" (a path would split): the markup of an id has no closing tag.
XSS_ID = '<img src=x onerror="window.pwned=3"><b>'
PNG = tiny_png(4, 4, (20, 120, 200))
PDF = tiny_pdf("console receipt")
CUSTOMER = "Ada Lovelace"


@dataclass
class Scene:
    """Conversation ids (and turn ids) of what was made."""

    images: str
    images_tid: str
    parked: str
    parked_tid: str
    failed: str
    failed_tid: str
    taken: str
    taken_tid: str
    summarised: str
    xss: str
    xss_tid: str
    tenant: str
    tenant_tid: str
    family: str
    family_tid: str
    handed: str
    handed_tid: str


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def submit(gateway: GatewayProcess, cid: str, message: Any, agent: str, **more: Any) -> str:
    with gateway.client("submitter") as http:
        response = http.post(turns_path(cid), json={"message": message, "agent": agent, **more})
    assert response.status_code == 202, response.text
    return str(response.json()["turn_id"])


def settled(gateway: GatewayProcess, cid: str, tid: str, until: str = "settled") -> dict[str, Any]:
    """The turn once final (or parked, with until="settled"), waiting up to a minute."""
    deadline = time.monotonic() + 90
    with gateway.client("admin") as http:
        while True:
            url = f"{turns_path(cid)}/{tid}"
            body: dict[str, Any] = http.get(url, params={"wait": 30, "until": until}).json()
            done = body["status"] not in ("queued", "running")
            parked = body["status"] in ("awaiting_approval", "waiting")
            if done and (until == "settled" or not parked):
                return body
            assert time.monotonic() < deadline, body


def conversation(http: httpx.Client, cid: str) -> dict[str, Any]:
    response = http.get(f"/v1/conversations/{quote(cid, safe='')}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def build(gateway: GatewayProcess, pool: WorkerPool) -> Scene:
    tag = uuid.uuid4().hex[:6]
    ids = {
        name: f"console-{name}-{tag}"
        for name in ("images", "parked", "failed", "taken", "summarised", "family", "handed")
    }
    xss_cid = f"console-{XSS_ID}-{tag}"
    tenant = f"tenant-a:console-{tag}"
    image_message = {"role": "user", "content": [
        {"type": "text", "text": "what is in these?"},
        {"type": "image", "data": _b64(PNG), "mime_type": "image/png"},
        {"type": "file", "data": _b64(PDF), "mime_type": "application/pdf",
         "filename": "receipt.pdf"},
    ]}  # fmt: skip
    images_tid = submit(gateway, ids["images"], image_message, "echo")
    failed_tid = submit(gateway, ids["failed"], "this will fail", "failer")
    family_tid = submit(gateway, ids["family"], "find the receipt", "family")
    handed_tid = submit(gateway, ids["handed"], "my invoice", "front")
    before = submit(gateway, ids["parked"], "my order A-7 arrived broken", "refunder")
    order = {"amount": 7, "order": "A-7"}
    metadata = {"customer": CUSTOMER, "order": "A-7", "cents": 700}
    parked_tid = submit(gateway, ids["parked"], json.dumps(order), "refunder", metadata=metadata)
    marked = {"amount": 1, "order": XSS}
    xss_tid = submit(gateway, xss_cid, json.dumps(marked), "refunder",
                     metadata={XSS: XSS, "note": XSS})  # fmt: skip
    tenant_tid = submit(gateway, tenant, f"tenant hello {XSS}", "echo")
    for text in ("one", "two", "three"):
        submit(gateway, ids["summarised"], f"summary turn {text}", "compacting")
    for cid, tid in (
        (ids["images"], images_tid),
        (ids["failed"], failed_tid),
        (ids["parked"], before),
        (ids["parked"], parked_tid),
        (xss_cid, xss_tid),
    ):
        settled(gateway, cid, tid)  # fmt: skip
    with gateway.client("admin") as http:
        wait_until(lambda: conversation(http, ids["summarised"])["summary"], 60,
                   what="the summary of the compacting conversation")  # fmt: skip
        wait_until(lambda: conversation(http, tenant)["stored_turns"] == 1, 30)
    assert settled(gateway, ids["family"], family_tid, "final")["status"] == "succeeded"
    assert settled(gateway, ids["handed"], handed_tid, "final")["status"] == "succeeded"
    # Last: its tool kills the worker running it, and whatever else that worker held.
    taken_tid = submit(gateway, ids["taken"], "the long step", "taker")
    assert settled(gateway, ids["taken"], taken_tid, "final")["status"] == "succeeded"
    return Scene(
        images=ids["images"], images_tid=images_tid, parked=ids["parked"], parked_tid=parked_tid,
        failed=ids["failed"], failed_tid=failed_tid, taken=ids["taken"], taken_tid=taken_tid,
        summarised=ids["summarised"], xss=xss_cid, xss_tid=xss_tid, tenant=tenant,
        tenant_tid=tenant_tid, family=ids["family"], family_tid=family_tid,
        handed=ids["handed"], handed_tid=handed_tid,
    )  # fmt: skip

"""The approvals inbox shows an approval expiring: workers whose approvals wait 3 s, a
turn parks, the page counts down, the sweeper fails the turn, and the page drops it
without a reload (real chromium, real worker, real gateway)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.support.browser import browser_fixture, page_fixture  # noqa: F401  (fixtures)
from tests.support.gateway import GatewayProcess, key_of, module_gateway
from tests.support.workers import module_pool

pytestmark = pytest.mark.slow

pool = module_pool(1, approval_ttl_s=3, sweep_interval_s=0.5)
gateway = module_gateway()


def test_an_expired_approval_leaves_the_page(page: Any, gateway: GatewayProcess) -> None:
    page.goto(f"{gateway.url}/inbox#key={key_of('approver')}")
    page.locator("#status").filter(has_text="wait").wait_for()
    cid = f"expiry-{uuid.uuid4().hex[:8]}"
    with gateway.client("submitter") as http:
        turns = f"/v1/conversations/{cid}/turns"
        tid = http.post(turns, json={"message": "pay", "agent": "approver"}).json()["turn_id"]
        item = page.locator(f'li.turn[data-turn-id="{tid}"]')
        item.wait_for(state="visible")
        assert "expires in" in (item.locator(".expires").text_content() or "")
        assert "soon" in (item.locator(".expires").get_attribute("class") or "")
        item.wait_for(state="detached")
        final = http.get(f"{turns}/{tid}", params={"wait": 30, "until": "final"}).json()
    assert final["status"] == "expired"
    [decision] = final["decisions"].values()
    assert decision["expired"] and not decision["approved"]

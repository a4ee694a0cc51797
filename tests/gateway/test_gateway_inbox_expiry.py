"""The approvals inbox shows an approval expiring: a turn parks, the page counts down
(under 5 minutes left: shown as soon), the approval expires, the sweeper fails the turn,
and the page drops it without a reload (real chromium, real worker, real gateway). The
test ends the approval itself: a parked turn's lease lives exactly as long as its
approval may wait, so deleting it is the expiry, never a race with a short ttl."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis

from convoq.redis.keys import KeySchema
from tests.support.browser import browser_fixture, page_fixture  # noqa: F401  (fixtures)
from tests.support.gateway import GatewayProcess, key_of, module_gateway
from tests.support.workers import WorkerPool, module_pool

pytestmark = pytest.mark.slow

pool = module_pool(1, approval_ttl_s=240, sweep_interval_s=0.5)
gateway = module_gateway()


def test_an_expired_approval_leaves_the_page(
    page: Any, gateway: GatewayProcess, pool: WorkerPool, redis_client: redis.Redis
) -> None:
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
        assert redis_client.delete(KeySchema(pool.prefix).lease(cid)) == 1
        item.wait_for(state="detached")
        final = http.get(f"{turns}/{tid}", params={"wait": 30, "until": "final"}).json()
    assert final["status"] == "expired"
    [decision] = final["decisions"].values()
    assert decision["expired"] and not decision["approved"]

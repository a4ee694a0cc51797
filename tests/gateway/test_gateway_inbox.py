"""The approvals inbox page in a real headless browser (Debian's chromium driven by
Playwright): a turn parks on a worker, the page shows it live, a click approves it, the
turn finishes on a worker and the page shows it gone; deny with a reason; markup in a
message stays text; a card shows the turn's metadata and the conversation before it
(bounded: the last few turns, text cut short, attachments by name and type only).
Skipped, saying why, where chromium or Playwright is missing
(``.ci/run`` installs both)."""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from convoq import Client, Message
from convoq.messages import FilePart, MessageRole, TextPart
from tests.support.browser import browser_fixture, page_fixture  # noqa: F401  (fixtures)
from tests.support.gateway import GatewayProcess, key_of, module_gateway
from tests.support.workers import module_pool

pytestmark = pytest.mark.slow

pool = module_pool(1, agents="tests.support.worker_agents,tests.support.approval_agents")
gateway = module_gateway()


def _submit(
    gateway: GatewayProcess, cid: str, text: str = "pay", *, agent: str = "approver", **more: Any
) -> str:
    with gateway.client("submitter") as http:
        response = http.post(
            f"/v1/conversations/{quote(cid, safe='')}/turns",
            json={"message": text, "agent": agent, **more},
        )
        assert response.status_code == 202, response.text
        return str(response.json()["turn_id"])


def _final(gateway: GatewayProcess, cid: str, tid: str) -> dict[str, Any]:
    with gateway.client("reader") as http:
        url = f"/v1/conversations/{quote(cid, safe='')}/turns/{tid}"
        body: dict[str, Any] = http.get(url, params={"wait": 30, "until": "final"}).json()
        return body


def _open_inbox(page: Any, gateway: GatewayProcess, key: str = "approver") -> None:
    page.goto(f"{gateway.url}/inbox#key={key_of(key)}")
    page.locator("#status").filter(has_text="wait").wait_for()


def test_a_parked_turn_appears_is_approved_with_a_click_and_goes(
    page: Any, gateway: GatewayProcess
) -> None:
    _open_inbox(page, gateway)
    assert "#key=" not in page.url  # the key left the address bar
    cid = f"inbox-{uuid.uuid4().hex[:8]}"
    tid = _submit(gateway, cid)  # submitted after the page loaded: it must appear live
    item = page.locator(f'li.turn[data-turn-id="{tid}"]')
    item.wait_for(state="visible")
    assert item.locator(".agent").text_content() == "approver"
    assert item.locator(".conversation").text_content() == cid
    assert "expires in" in (item.locator(".expires").text_content() or "")
    call = item.locator(".call")
    assert call.locator(".tool").text_content() == "transfer"
    assert call.locator("pre.arguments").text_content() == '{\n  "amount": 5\n}'

    call.locator("button.approve").click()
    outcome = page.locator("#outcome")
    outcome.filter(has_text="the turn resumes on a worker").wait_for()
    assert (outcome.text_content() or "").startswith("Approved transfer")

    done = _final(gateway, cid, tid)
    assert done["status"] == "succeeded"
    assert done["text"].startswith("after tool: transferred 5")
    item.wait_for(state="detached")  # the page updated without a reload


def test_deny_with_a_reason_and_markup_in_the_message_stays_text(
    page: Any, gateway: GatewayProcess
) -> None:
    cid = f"inbox-{uuid.uuid4().hex[:8]}"
    text = "pay <img src=x onerror=window.pwned=1> <b>now</b>"
    tid = _submit(gateway, cid, text)
    _open_inbox(page, gateway)
    item = page.locator(f'li.turn[data-turn-id="{tid}"]')
    item.wait_for(state="visible")
    assert item.locator(".input").text_content() == text
    assert item.locator("img").count() == 0
    assert page.evaluate("window.pwned") is None

    item.locator("input.reason").fill("not this month")
    item.locator("button.deny").click()
    page.locator("#outcome").filter(has_text="Denied transfer").wait_for()
    text = _final(gateway, cid, tid)["text"]
    assert "denied" in text and "not this month" in text
    item.wait_for(state="detached")


def test_without_the_approve_scope_the_page_shows_nothing_and_asks_for_a_key(
    page: Any, gateway: GatewayProcess
) -> None:
    cid = f"inbox-{uuid.uuid4().hex[:8]}"
    tid = _submit(gateway, cid)
    page.goto(f"{gateway.url}/inbox#key={key_of('reader')}")
    page.locator("#key-form").wait_for(state="visible")
    assert page.locator("li.turn").count() == 0
    page.locator("#key").fill(key_of("approver"))
    page.locator("#key-form button").click()
    page.locator(f'li.turn[data-turn-id="{tid}"]').wait_for(state="visible")
    with gateway.client("approver") as http:
        http.post(f"/v1/conversations/{cid}/turns/{tid}/discard")


def test_the_page_loads_nothing_from_elsewhere(gateway: GatewayProcess) -> None:
    response = httpx.get(f"{gateway.url}/inbox")
    assert response.status_code == 200
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert "http" not in response.text.split("<body>", 1)[1]


def _earlier_turn(client: Client, cid: str, text: str, *files: FilePart) -> None:
    message = Message(role=MessageRole.USER, content=[TextPart(text=text), *files])
    assert client.submit(cid, message, agent="refunder").wait(30).text == f"noted: {text}"


def test_a_card_shows_whose_turn_it_is_and_the_conversation_before_it(
    page: Any, gateway: GatewayProcess, client: Client
) -> None:
    cid = f"inbox-{uuid.uuid4().hex[:8]}"
    hello = "my order <img src=x onerror=window.pwned=1> never came"
    receipt = FilePart(data=b"%PDF-1.4 receipt", mime_type="application/pdf",
                       filename="receipt<b>.pdf")  # fmt: skip
    _earlier_turn(client, cid, hello, receipt)
    metadata = {"customer": "<b>Ada</b>", "order": "A-1", "cents": 500}
    tid = _submit(gateway, cid, json.dumps({"amount": 5, "order": "A-1"}), agent="refunder",
                  metadata=metadata)  # fmt: skip
    _open_inbox(page, gateway)
    item = page.locator(f'li.turn[data-turn-id="{tid}"]')
    item.wait_for(state="visible")

    assert item.locator("dl.metadata dt").all_text_contents() == ["customer", "order", "cents"]
    assert item.locator("dl.metadata dd").all_text_contents() == ["<b>Ada</b>", "A-1", "500"]
    messages = item.locator("details.conversation-before li.message")
    assert messages.locator(".role").all_text_contents() == ["user", "assistant"]
    assert messages.locator(".text").all_text_contents() == [hello, f"noted: {hello}"]
    attachments = messages.nth(0).locator("ul.attachments li")
    assert attachments.all_text_contents() == ["receipt<b>.pdf · application/pdf"]
    # Everything stayed text: no element came from the data, no script ran.
    assert item.locator("img").count() == 0 and item.locator("b").count() == 0
    assert page.evaluate("window.pwned") is None
    assert item.locator(".call .tool").text_content() == "refund"

    item.locator("button.approve").click()
    page.locator("#outcome").filter(has_text="the turn resumes on a worker").wait_for()
    assert _final(gateway, cid, tid)["text"] == "refund: refunded 5 on A-1"


def test_the_conversation_a_card_shows_is_bounded(client: Client, gateway: GatewayProcess) -> None:
    cid = f"inbox-{uuid.uuid4().hex[:8]}"
    _earlier_turn(client, cid, "the first turn, not shown")
    long_text = "x" * 5000
    big = FilePart(data=b"%PDF-1.4 " + b"0" * 200_000, mime_type="application/pdf",
                   filename="big.pdf")  # fmt: skip
    for text in ("second", long_text, "fourth"):
        _earlier_turn(client, cid, text, *([big] if text == "second" else []))
    tid = _submit(gateway, cid, json.dumps({"amount": 1, "order": "C-3"}), agent="refunder")
    with gateway.client("approver") as http:
        _final_or_parked = http.get(
            f"/v1/conversations/{quote(cid, safe='')}/turns/{tid}", params={"wait": 30}
        )
        assert _final_or_parked.json()["status"] == "awaiting_approval"
        response = http.get("/v1/approvals", params={"limit": 500})
    [card] = [t for t in response.json()["turns"] if t["turn_id"] == tid]
    shown = card["conversation"]
    # The last three stored turns, a user message and an answer each.
    assert [m["text"][:6] for m in shown if m["role"] == "user"] == ["second", "xxxxxx", "fourth"]
    assert len(shown) == 6
    [cut] = [m for m in shown if m["role"] == "user" and m["text"].startswith("x")]
    assert cut["text"] == "x" * 1000 + "…"
    assert shown[0]["attachments"] == [
        {"kind": "file", "mime_type": "application/pdf", "filename": "big.pdf"}
    ]
    assert len(response.content) < 40_000  # the 200 kB attachment is named, never sent
    with gateway.client("approver") as http:
        http.post(f"/v1/conversations/{quote(cid, safe='')}/turns/{tid}/discard")

"""The console's pages in a real headless browser (Debian's chromium driven by
Playwright) over a real gateway and real workers: conversations found by prefix, a
conversation's transcript (images shown, a PDF downloaded, tool calls folded), summary and
usage, live while a turn runs; a turn's timeline (a takeover after its worker was killed,
a failed turn's error); an approval from the console by keyboard alone; the workers with
their slots and the backlog per partition; buttons only for the scopes a key has; markup
in ids, messages, metadata and tool arguments shown as text; a tenant-scoped key that
sees only its prefix. Every test fails on an error in the page's console. Skipped,
saying why, where chromium or Playwright is missing (``.ci/run`` installs both)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis

from tests.support import console_scene
from tests.support.browser import browser_fixture, page_fixture  # noqa: F401  (fixtures)
from tests.support.console_scene import CUSTOMER, PDF, XSS, Scene
from tests.support.gateway import GatewayProcess, key_of, module_gateway
from tests.support.workers import WorkerPool, module_pool

pytestmark = pytest.mark.slow

pool = module_pool(2, **console_scene.POOL_SETTINGS)
# The scripted model priced (US dollars per million tokens): the pages show costs.
gateway = module_gateway(MODEL_PRICES='{"scripted": {"input": 2, "output": 8}}')


@pytest.fixture(scope="module")
def scene(gateway: GatewayProcess, pool: WorkerPool) -> Scene:
    return console_scene.build(gateway, pool)


class Watched:
    """A page whose console errors and failed requests are collected."""

    def __init__(self, page: Any, gateway: GatewayProcess) -> None:
        self.page, self.gateway = page, gateway
        self.errors: list[str] = []
        self.answers: list[tuple[str, int]] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        page.on("response", lambda r: self.answers.append((r.url, r.status)))

    def open(self, route: str, key: str = "admin") -> None:
        """The console at ``route`` (``#/...``), with ``key`` given in the fragment."""
        route = route.lstrip("#")
        self.page.goto(f"{self.gateway.url}/console#{route}&key={key_of(key)}")
        self.ready()

    def ready(self) -> None:
        self.page.locator('main#view[data-state="ready"]').wait_for()

    def go(self, route: str) -> None:
        self.page.evaluate("(r) => { location.hash = r; }", route)
        ready = "document.querySelector('main').dataset.state === 'ready'"
        self.page.wait_for_function(f"(r) => location.hash === r && {ready}", arg=route)

    def text(self) -> str:
        return str(self.page.locator("main").inner_text())

    def shot(self, tmp_path: Path, name: str) -> str:
        """A screenshot taken (its pixels are not compared) and the page's text."""
        path = tmp_path / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 1000
        return str(self.page.locator("body").inner_text())


@pytest.fixture
def watched(page: Any, gateway: GatewayProcess) -> Iterator[Watched]:
    seen = Watched(page, gateway)
    yield seen
    assert seen.errors == [], seen.errors
    assert page.evaluate("window.pwned") is None


def _c(cid: str) -> str:
    return "#/c/" + quote(cid, safe="")


def _t(cid: str, tid: str) -> str:
    return _c(cid) + "/t/" + tid


def test_the_conversations_page_lists_and_finds_by_prefix(
    watched: Watched, scene: Scene, tmp_path: Path
) -> None:
    watched.open("/conversations?prefix=console-")
    page = watched.page
    row = page.locator(f'tr[data-conversation-id="{scene.parked}"]')
    assert row.locator(".status").all_text_contents() == ["awaiting_approval", "awaiting_approval"]
    assert "failed" in page.locator(f'tr[data-conversation-id="{scene.failed}"]').inner_text()
    text = watched.shot(tmp_path, "conversations")
    for cid in (scene.images, scene.taken, scene.summarised):
        assert cid in text
    assert scene.tenant not in text  # outside the prefix searched for

    page.locator("#prefix").fill(scene.images)
    page.locator("#prefix").press("Enter")
    page.wait_for_function("() => location.hash.includes('prefix=console-images')")
    watched.ready()
    assert page.locator("#conversations tbody tr").count() == 1
    assert page.locator("#found").inner_text().startswith("1 conversation")


def test_a_conversation_shows_images_files_tool_calls_summary_and_usage(
    watched: Watched, scene: Scene, tmp_path: Path
) -> None:
    page = watched.page
    watched.open(_c(scene.images))
    image = page.locator("#transcript img")
    page.wait_for_function("() => document.querySelector('#transcript img').naturalWidth === 4")
    assert image.get_attribute("src", timeout=5000).startswith("blob:")
    with page.expect_download() as download:
        page.locator("#transcript button.download").click()
    assert Path(download.value.path()).read_bytes() == PDF
    assert "Download receipt.pdf (application/pdf" in page.locator("button.download").inner_text()
    watched.shot(tmp_path, "images")

    watched.go(_c(scene.taken))
    call = page.locator("details.tool-call")
    assert call.locator("summary").inner_text() == "calls step (step-1)"
    assert not call.locator("pre.arguments").is_visible()  # folded
    call.locator("summary").click()
    assert call.locator("pre.arguments").inner_text() == '{\n  "text": "the long step"\n}'
    assert page.locator("details.tool-result summary").inner_text() == "result of step"
    # Two model calls of 12 prompt and 3 completion tokens at $2 and $8 per million.
    taken = page.locator("#facts").inner_text().replace("\t", "\n")
    assert "Cost so far\n$0.000096\n" in taken

    watched.go(_c(scene.summarised))
    facts = page.locator("#facts").inner_text()
    assert "users said summary turn one, summary turn two" in facts
    assert "(covers the first 2 turns)" in facts
    assert "Stored turns\n3" in facts.replace("\t", "\n")
    assert "model calls" in facts
    assert "Cost so far\n$0.00\n" in facts.replace("\t", "\n")  # its model reports no tokens


def test_a_takeover_and_a_failure_in_the_timeline(
    watched: Watched, scene: Scene, tmp_path: Path
) -> None:
    page = watched.page
    watched.open(_t(scene.taken, scene.taken_tid))
    steps = page.locator("#steps li.step")
    kinds = [steps.nth(i).get_attribute("data-kind") for i in range(steps.count())]
    assert kinds == ["status", "run", "model_call", "tool_call", "resumed", "model_call", "status"]
    assert "worker_lost · attempt 2" in page.locator('li[data-kind="resumed"]').inner_text()
    tool = page.locator('li[data-kind="tool_call"]')
    assert "ran 2 times" in tool.inner_text()
    tool.locator("summary").click()
    assert "idempotency key " in tool.locator(".idempotency").inner_text()
    assert tool.locator("pre.result").inner_text() == "stepped the long step"
    first_call = page.locator('li[data-kind="model_call"]').first.inner_text()
    # 12 prompt tokens at $2 and 3 completion tokens at $8 per million.
    assert "scripted" in first_call and "$0.000048" in first_call
    text = watched.shot(tmp_path, "takeover")
    assert "Attempts\n2" in text.replace("\t", "\n")
    assert "Cost\n$0.000096" in text.replace("\t", "\n")

    watched.go(_t(scene.failed, scene.failed_tid))
    error = page.locator('li[data-kind="error"]')
    assert error.locator(".error-type").inner_text() == "ModelError"
    assert "failed on purpose" in error.inner_text()


def test_a_parent_turn_links_to_its_child_and_back(
    watched: Watched, scene: Scene, tmp_path: Path
) -> None:
    page = watched.page
    watched.open(_t(scene.family, scene.family_tid))
    child = page.locator("ul.children li")
    assert "helper for ask-helper" in child.inner_text() and "succeeded" in child.inner_text()
    child.locator("a.child-link").click()
    page.locator("p.parent").wait_for(timeout=10000)
    assert f"Answers call ask-helper of {scene.family_tid}" in page.locator("p.parent").inner_text()
    watched.shot(tmp_path, "child")
    page.locator("a.parent-link").click()
    page.locator("ul.children").wait_for(timeout=10000)

    watched.go(_t(scene.handed, scene.handed_tid))
    handoff = page.locator('li[data-kind="handoff"]')
    assert "front → desk" in handoff.inner_text() and "to-desk" in handoff.inner_text()


def _tab_to(page: Any, selector: str, limit: int = 80) -> None:
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate("(s) => Boolean(document.activeElement?.matches(s))", selector):
            return
    raise AssertionError(f"Tab never reached {selector}")


def test_an_approval_by_keyboard_from_the_conversations_page(
    watched: Watched, scene: Scene, gateway: GatewayProcess, tmp_path: Path
) -> None:
    page = watched.page
    watched.open(f"/conversations?prefix={quote(scene.parked)}", key="approver")
    _tab_to(page, "#conversations td.id a")
    page.keyboard.press("Enter")
    watched.ready()
    _tab_to(page, f'#inbox li[data-turn-id="{scene.parked_tid}"] a')
    page.keyboard.press("Enter")
    watched.ready()
    text = watched.shot(tmp_path, "parked")
    assert f"customer\n{CUSTOMER}" in text.replace("\t", "\n")  # whose refund it is
    before = page.locator("#before .message .text").all_text_contents()
    assert before == ["my order A-7 arrived broken", "noted: my order A-7 arrived broken"]
    assert page.locator("button", has_text="Cancel turn").count() == 0  # approve, not submit
    _tab_to(page, "input.reason")
    page.keyboard.type("receipt checked")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Approve"
    page.keyboard.press("Enter")
    page.locator("#notice").filter(has_text="Approved refund").wait_for()
    # The page follows the turn: it resumes on a worker and succeeds.
    page.locator("#turn-head .status", has_text="succeeded").wait_for(timeout=60_000)
    decision = page.locator('li[data-kind="approval"] .decision').inner_text()
    assert decision.startswith("approved by approver at ")
    assert decision.endswith(": receipt checked")
    page.locator(".conversation-link").click()
    watched.ready()
    result = page.locator("#transcript details.tool-result summary").first
    assert result.inner_text() == "result of refund · approved by approver"


def test_buttons_follow_the_key_s_scopes(watched: Watched, scene: Scene) -> None:
    page = watched.page
    route = _t(scene.xss, scene.xss_tid)
    for key, shown in (("reader", []), ("submitter", ["Cancel turn"]),
                       ("approver", ["Approve", "Deny", "Discard turn"])):  # fmt: skip
        watched.open(route, key=key)
        page.locator("#turn-head .status").wait_for()
        assert page.locator("#actions button").all_text_contents() == shown, key


def test_markup_in_ids_messages_metadata_and_arguments_stays_text(
    watched: Watched, scene: Scene
) -> None:
    page = watched.page
    watched.open("/conversations?prefix=" + quote("console-<img"))
    link = page.locator("#conversations td.id a")
    assert link.inner_text() == scene.xss
    link.click()
    watched.ready()
    assert page.locator("main h2").inner_text() == scene.xss
    watched.go(_t(scene.xss, scene.xss_tid))
    assert page.locator("dl.metadata dt").all_text_contents() == [XSS, "note"]
    assert page.locator("dl.metadata dd").all_text_contents() == [XSS, XSS]
    arguments = json.dumps({"amount": 1, "order": XSS}, indent=2)
    assert page.locator(".pending pre.arguments").inner_text() == arguments
    assert page.locator('li[data-kind="approval"] pre.arguments').inner_text() == arguments
    watched.go(_c(scene.tenant))
    assert XSS in page.locator("#transcript .message[data-role=user]").inner_text()
    # No element came from the data: no image, script or bold anywhere in the page.
    assert page.locator("main img, main script, main b").count() == 0


def test_a_conversation_page_is_live_while_its_turn_runs(
    watched: Watched, gateway: GatewayProcess, pool: WorkerPool, r: redis.Redis
) -> None:
    word = f"live{uuid.uuid4().hex[:6]}"
    cid = f"console-live-{word}"
    tid = console_scene.submit(gateway, cid, f"{word} please", "blocker")
    page = watched.page
    watched.open(_c(cid))
    live = page.locator("#live")
    live.filter(has_text="Running now").wait_for()
    assert tid in live.inner_text()
    r.set(f"{pool.prefix}:test:release:{word}", "1")
    answer = page.locator("#transcript .message[data-role=assistant] .text")
    answer.wait_for()
    assert answer.inner_text() == f"released {word} please"
    live.wait_for(state="hidden")
    assert page.locator(f'#turns tr[data-turn-id="{tid}"] .status').inner_text() == "succeeded"


def test_the_workers_page_shows_slots_backlog_and_a_dead_worker(
    watched: Watched, pool: WorkerPool, gateway: GatewayProcess, r: redis.Redis
) -> None:
    [extra] = pool.start(1)  # killed below: it must be seen dead
    word = f"hold{uuid.uuid4().hex[:6]}"
    cid = f"console-busy-{word}"
    console_scene.submit(gateway, cid, f"{word} first", "blocker")
    console_scene.submit(gateway, cid, f"{word} second", "blocker")
    page = watched.page
    try:
        watched.open("/workers")
        page.locator("#workers td.slots", has_text="1 of 8").wait_for()
        busy = page.locator("#partitions tr", has=page.locator("td.running", has_text="1"))
        assert busy.locator("td.queued").inner_text() == "1"
        extra.kill()
        row = page.locator(f'#workers tr[data-worker="{extra.name}"]')
        row.locator(".status", has_text="dead").wait_for(timeout=20_000)
        assert "taker" in page.locator("#workers").inner_text()
    finally:
        r.set(f"{pool.prefix}:test:release:{word}", "1")


def test_a_tenant_key_sees_only_its_prefix_on_every_page(
    watched: Watched, scene: Scene, gateway: GatewayProcess
) -> None:
    page = watched.page
    watched.open("/conversations", key="tenant")
    ids = page.locator("#conversations td.id").all_text_contents()
    assert scene.tenant in ids and all(i.startswith("tenant-a:") for i in ids)
    watched.go(_c(scene.tenant))
    assert page.locator("#transcript .message").count() == 2
    watched.go(_t(scene.tenant, scene.tenant_tid))
    assert page.locator("#turn-head .status").inner_text() == "succeeded"
    watched.go("#/workers")
    assert page.locator("#partitions td.parked").all_text_contents() == ["0"] * 4
    # Outside its prefix: a 403, and nothing of the conversation on the page.
    page.evaluate("(r) => { location.hash = r; }", _c(scene.images))
    page.locator('main#view[data-state="error"]').wait_for()
    assert "may not reach that conversation" in page.locator("#notice").inner_text()
    assert page.locator("#transcript").count() == 0
    calls = [(url, status) for url, status in watched.answers if "/v1/" in url]
    assert {status for _, status in calls} <= {200, 403, 404}
    for url, status in calls:
        if "/v1/conversations/" in url and status == 200:
            assert "tenant-a%3A" in url, url
    # The page's own console logs each refused request as an error: those are expected.
    refused = re.compile(r"status of (403|404)")
    watched.errors[:] = [e for e in watched.errors if not refused.search(e)]


def test_the_inbox_links_a_card_to_the_turn_in_the_console(watched: Watched, scene: Scene) -> None:
    page = watched.page
    page.goto(f"{watched.gateway.url}/inbox#key={key_of('approver')}")
    card = page.locator(f'li.turn[data-turn-id="{scene.xss_tid}"]')
    card.wait_for()
    card.locator("a.console-turn").click()
    watched.ready()
    assert page.locator("main h2").inner_text() == f"Turn {scene.xss_tid}"
    assert page.locator(".conversation-link").inner_text() == scene.xss

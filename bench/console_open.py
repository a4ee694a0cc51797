"""How long the console takes to open a conversation of 10,000 turns, in a real browser.

A private redis-server holds one conversation of 10,000 turns, run by the worker's own
runner in this process (each turn a real submit, take and commit: its turn record, events
and stored history as a worker leaves them; every 100th turn carries an image, every 10th
calls a tool). A ``convoq gateway`` process serves the console; Debian's chromium
(headless, driven by Playwright) opens ``/console#/c/{cid}`` in a fresh browser context
each time and reads when the page says it is ready: the overview, the newest transcript
page, the newest turns and the rendering of all three, from navigation start
(``performance.now()``). Beside it, the same for a conversation of 10 turns, and the time
of each JSON route the page calls, over HTTP from this process.

Run ``python -m bench console`` (needs ``chromium`` and the ``dev`` extra's Playwright).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from bench._harness import redis_server
from convoq import Agent, Message, ToolCall, tool
from convoq._ports import free_loopback_port
from convoq.ids import new_turn_id
from convoq.messages import ImagePart, MessageRole, TextPart
from convoq.models import ModelRequest, ScriptedModel
from convoq.redis import TurnProtocol
from convoq.worker._spawn import process
from convoq.worker.profiles import Profiles
from convoq.worker.runner import Runner, RunnerConfig

ROOT = Path(__file__).resolve().parents[1]
KEY = "bench-console-key-0123456789"
PREFIX = "bench"
TURNS = 10_000
OPENS = 7
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000185d0a3d80000000049454e44ae426082"
)


@tool
def look_up(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


def _answer(request: ModelRequest) -> Message:
    last = request.messages[-1]
    if last.role == MessageRole.TOOL:
        return Message.assistant(f"from the notes: {last.text}")
    if last.text.endswith("0 look"):
        call = ToolCall(id="look-1", name="look_up", arguments={"topic": last.text})
        return Message.assistant("", [call])
    return Message.assistant(f"answer to {last.text}")


AGENT = Agent(ScriptedModel(_answer), name="bench", tools=[look_up], keep_last_turns=1)


def _message(n: int) -> Message:
    text = f"question {n}" + (" look" if n % 10 == 0 else "")
    parts: list[Any] = [TextPart(text=text)]
    if n % 100 == 1:
        parts.append(ImagePart(data=PNG, mime_type="image/png"))
    return Message(content=parts)


async def populate(url: str, cid: str, turns: int) -> float:
    """Run ``turns`` turns of ``cid`` through the runner; the seconds it took."""
    protocol = TurnProtocol.from_url(url, prefix=PREFIX)
    runner = Runner(protocol, Profiles([AGENT]), RunnerConfig(worker_id="bench:1"))
    started = time.perf_counter()
    try:
        # In batches: a conversation queues at most CONVOQ_MAX_QUEUED_PER_CONVERSATION.
        for first in range(0, turns, 500):
            batch = range(first, min(first + 500, turns))
            for n in batch:
                await protocol.submit(cid, new_turn_id(), agent="bench", message=_message(n),
                                      options={})  # fmt: skip
            report = await runner.drain(cid)
            assert len(report.succeeded) == len(batch), report
    finally:
        await protocol.close()
    return time.perf_counter() - started


def start_gateway(stack: ExitStack, url: str, home: Path) -> str:
    port = free_loopback_port()
    keys = json.dumps([{"key": KEY, "scopes": ["read"], "name": "bench"}])
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOQ_")}
    env.update(CONVOQ_REDIS_URL=url, CONVOQ_PREFIX=PREFIX, CONVOQ_GATEWAY_API_KEYS=keys)
    command = [sys.executable, "-m", "convoq.cli", "gateway", f"--port={port}"]
    stack.enter_context(process(command, env, home / "gateway.log", cwd=ROOT))
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return base
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"the gateway did not start; see {home / 'gateway.log'}")


def open_times(base: str, cid: str, opens: int) -> list[float]:
    """Milliseconds from navigation start to the page's ready mark, one fresh context each."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    times = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        try:
            for _ in range(opens):
                context = browser.new_context()
                page = context.new_page()
                page.goto(f"{base}/console#/c/{quote(cid, safe='')}&key={KEY}")
                page.locator('main#view[data-state="ready"]').wait_for(timeout=60_000)
                assert page.locator("#transcript li.stored-turn").count() > 0
                times.append(float(page.evaluate("document.body.dataset.readyMs")))
                context.close()
        finally:
            browser.close()
    return times


def route_times(base: str, cid: str, rounds: int = 9) -> dict[str, float]:
    """Median milliseconds of each JSON route the conversation page calls."""
    path = f"/v1/conversations/{quote(cid, safe='')}"
    routes = {"overview": path, "transcript": f"{path}/transcript?limit=20",
              "turns": f"{path}/turns?limit=50"}  # fmt: skip
    found: dict[str, float] = {}
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"}) as http:
        for name, route in routes.items():
            samples = []
            for _ in range(rounds):
                started = time.perf_counter()
                assert http.get(route).status_code == 200
                samples.append((time.perf_counter() - started) * 1000)
            found[name] = statistics.median(samples)
    return found


def _line(label: str, times: list[float]) -> str:
    return (f"{label}: median {statistics.median(times):.0f} ms"
            f" [{min(times):.0f}-{max(times):.0f}] over {len(times)} opens")  # fmt: skip


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="convoq-bench-console-") as work, ExitStack() as stack:
        home = Path(work)
        url = stack.enter_context(redis_server(home / "redis"))
        big, small = "bench-console-10000", "bench-console-10"
        took = asyncio.run(populate(url, big, TURNS))
        print(f"populated {TURNS} turns in {took:.1f} s (runner in process, real scripts)")
        asyncio.run(populate(url, small, 10))
        base = start_gateway(stack, url, home)
        for cid, turns in ((big, TURNS), (small, 10)):
            routes = route_times(base, cid)
            shown = ", ".join(f"{name} {ms:.1f} ms" for name, ms in routes.items())
            print(f"{turns} turns, each JSON route alone (median of 9): {shown}")
            print(
                _line(f"{turns} turns, the console page in chromium", open_times(base, cid, OPENS))
            )

"""The demo's HTTP part: ``convoq gateway`` served in this process (uvicorn in a thread)
over the demo's Redis, a turn submitted, followed and approved over HTTP, and the address
of the approvals inbox printed (``convoq demo --serve`` keeps it open)."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from rich.console import Console

from convoq._ports import free_loopback_port
from convoq.models._sse import SSEBuffer, iter_lines
from convoq.settings import ConvoqSettings, GatewayKey


@contextmanager
def gateway_server(env: dict[str, str]) -> Iterator[tuple[str, str]]:
    """A gateway on a free loopback port for the demo's settings; yields (url, admin key)."""
    import uvicorn

    from convoq.gateway import create_app

    key = secrets.token_urlsafe(24)
    port = free_loopback_port()
    settings = ConvoqSettings.resolve(
        redis_url=env["CONVOQ_REDIS_URL"],
        prefix=env["CONVOQ_PREFIX"],
        home=env["CONVOQ_HOME"],
        gateway_api_keys=[GatewayKey(key=key, scopes=("admin",), name="demo")],
    )
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="convoq-demo-gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", key
    finally:
        server.should_exit = True
        thread.join(10)


def http_turn(console: Console, url: str, key: str) -> None:
    """Submit a turn that parks, follow it over SSE, approve it, read the result."""
    console.rule("[bold]6. The same over HTTP: convoq gateway")
    turns = f"{url}/v1/conversations/web-demo/turns"
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        body = {"message": "Send 5 EUR to Erin", "agent": "banker"}
        accepted = http.post(turns, json=body, headers={"Idempotency-Key": "demo-1"}).json()
        tid = accepted["turn_id"]
        console.print(f"  POST {turns} -> 202, turn {tid}")
        _follow_until_parked(console, http, f"{turns}/{tid}/events")
        call = http.get(f"{turns}/{tid}").json()["pending_approvals"][0]
        console.print(f"  inbox: [link]{url}/inbox#key={key}[/link]")
        decided = http.post(f"{turns}/{tid}/approvals/{call['id']}", json={"decision": "approve"})
        console.print(f"  POST .../approvals/{call['id']} -> {decided.json()['outcome']}")
        done = http.get(f"{turns}/{tid}", params={"wait": 30, "until": "final"}).json()
        console.print(f"  GET .../{tid}?wait=30 -> [green]{done['status']}[/green]: {done['text']}")


def _follow_until_parked(console: Console, http: httpx.Client, events_url: str) -> None:
    with http.stream("GET", events_url) as response:
        events = SSEBuffer()  # the event stream read as the models' streams are
        for line in iter_lines(response.iter_bytes()):
            event = events.feed(line)
            if event is not None and event.event == "status":
                status: Any = json.loads(event.data).get("status")
                console.print(f"  SSE status -> [cyan]{status}[/cyan]")
                if status == "awaiting_approval":
                    return

"""``convoq demo``: the whole distributed stack on one machine, with no configuration.

An embedded redis-server in a temporary home, one worker process running the profiles of
:mod:`convoq.cli.demo_agents`, and a client in this process: two conversations submitted
fire-and-forget, memory across turns, an image and a PDF remembered, per-turn status
events, a tool call parked for approval and approved from here, and a signed webhook
received by a small HTTP server in this process. Everything is stopped at the end.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from convoq.cli._demo_gateway import gateway_server, http_turn
from convoq.client import Client
from convoq.messages import FilePart, ImagePart, Message, TextPart
from convoq.queue.signing import SIGNATURE_HEADER, verify_signature
from convoq.worker._spawn import worker_process

WORKER_NAME = "demo@localhost"
LOOPBACK = "127.0.0.1"


def tiny_png(width: int = 2, height: int = 2, rgb: tuple[int, int, int] = (200, 40, 40)) -> bytes:
    """A valid RGB PNG of one colour, built in code."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    row = b"\x00" + bytes(rgb) * width
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(row * height)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )


def tiny_pdf(text: str = "Hello from convoq") -> bytes:
    """A valid one-page PDF showing ``text`` (ASCII), with a correct xref table."""
    safe = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
    stream = f"BT /F1 18 Tf 36 100 Td ({safe}) Tj ET".encode("latin-1", "replace")
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 144] /Contents 4 0 R"
        b" /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    trailer = f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n"
    return bytes(out + trailer.encode())


# -- the pieces the demo runs --------------------------------------------------------------
class _Hooks:
    """What the local webhook receiver got."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.arrived = threading.Event()


@contextmanager
def _webhook_receiver() -> Iterator[tuple[str, _Hooks]]:
    hooks = _Hooks()

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            hooks.received.append((dict(self.headers), body))
            hooks.arrived.set()
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/convoq-hook", hooks
    finally:
        server.shutdown()
        server.server_close()


# -- the scenes ----------------------------------------------------------------------------
def _conversations(console: Console, client: Client) -> None:
    console.rule("[bold]1. Two conversations, submitted fire-and-forget")
    png, pdf = tiny_png(), tiny_pdf("Quarterly report: all good")
    attachments = Message(content=[
        TextPart(text="Here is a picture and my report."),
        ImagePart(data=png, mime_type="image/png"),
        FilePart(data=pdf, mime_type="application/pdf", filename="report.pdf"),
    ])  # fmt: skip
    plan: list[tuple[str, str | Message]] = [
        ("alice", "My name is Alice."),
        ("bob", "My name is Bob."),
        ("alice", "What is my name?"),
        ("bob", attachments),
        ("bob", "Which files have I sent you?"),
        ("bob", "And what is my name?"),
    ]
    handles = [(cid, m, client.submit(cid, m, agent="assistant")) for cid, m in plan]
    console.print(f"submitted {len(handles)} turns; each submit returned at once:")
    table = Table("conversation", "user", "assistant", "status")
    for cid, message, handle in handles:
        result = handle.wait(30)
        shown = message if isinstance(message, str) else _describe(message)
        table.add_row(cid, shown, result.text, f"[green]{result.status}[/green]")
    console.print(table)


def _describe(message: Message) -> str:
    extra = [f"+{p.mime_type} ({len(p.data)} B)" for p in message.attachments]
    return " ".join([message.text, *extra])


def _events(console: Console, client: Client) -> None:
    console.rule("[bold]2. Per-turn status events (XREAD on the turn's stream)")
    handle = client.submit("alice", "Thanks for remembering!", agent="assistant")
    text = ""
    for event in handle.events(timeout=30):
        if event.type == "status":
            console.print(f"  status  -> [cyan]{event.data['status']}[/cyan]")
        elif event.type == "text_delta":
            text += str(event.data["text"])
        elif event.type == "done":
            console.print(f"  streamed: {text!r}")
            console.print(f"  done    -> [green]{event.data['status']}[/green]")


def _approval(console: Console, client: Client) -> None:
    console.rule("[bold]3. A tool call parked for approval, approved from the client")
    handle = client.submit("treasury", "Send 20 EUR to Carol", agent="banker")
    parked = handle.wait(30)
    for call in parked.pending_approvals:
        console.print(f"  [magenta]{parked.status}[/magenta]: {call.name}({call.arguments})")
    later = client.submit("treasury", "My name is Dave.", agent="assistant")
    console.print(f"  a later turn of the same conversation waits: {later.status()}")
    for call in parked.pending_approvals:
        client.approve(handle, call.id)
        console.print(f"  approved {call.id}; the turn resumes on a worker")
    console.print(f"  result: [green]{handle.wait(30).text}[/green]")
    console.print(f"  then the later turn ran: {later.wait(30).text}")


def _webhook(console: Console, client: Client, url: str, hooks: _Hooks, secret: str) -> None:
    console.rule("[bold]4. A signed webhook when the turn is done")
    handle = client.submit(
        "alice", "Ping me when you are done.", agent="assistant", callback_url=url
    )
    handle.wait(30)
    if not hooks.arrived.wait(30):
        console.print("[red]  no webhook arrived[/red]")
        return
    headers, body = hooks.received[-1]
    header = headers.get(SIGNATURE_HEADER, "")
    valid = verify_signature(secret, header, body)
    payload = json.loads(body)
    console.print(f"  POST {url}\n  {SIGNATURE_HEADER}: {header[:40]}...")
    console.print(f"  signature valid: [green]{valid}[/green]; payload: {payload['status']},"
                  f" turn {payload['turn_id']}, text {payload['text']!r}")  # fmt: skip


def _history(console: Console, client: Client) -> None:
    console.rule("[bold]5. Bob's stored history (attachments kept byte for byte)")
    for message in client.history("bob"):
        console.print(f"  {message.role.value:>9}: {_describe(message)}")


# -- the whole run -------------------------------------------------------------------------
def run_demo(console: Console | None = None, *, serve: bool = False) -> int:
    """Run the demo; return the exit code (0 on success). ``serve``: then keep the worker
    and the gateway running until interrupted (to try the inbox page)."""
    from convoq.redis import embedded

    out = console or Console()
    gateway = _gateway_installed()
    if serve and not gateway:
        out.print(
            "error: --serve runs the HTTP gateway: pip install 'convoq[gateway]'", markup=False
        )
        return 2
    started = time.monotonic()
    secret = secrets.token_hex(16)
    mode = "openai gpt-4.1-mini" if os.environ.get("OPENAI_API_KEY") else "offline scripted model"
    with tempfile.TemporaryDirectory(prefix="convoq-demo-") as tmp, ExitStack() as stack:
        home = Path(tmp)
        stack.callback(embedded.stop, home)
        with out.status("starting the embedded Redis and a worker process..."):
            url = embedded.embedded_url(home)
            hook_url, hooks = stack.enter_context(_webhook_receiver())
            env = _worker_env(url, home, secret)
            client = stack.enter_context(
                Client(
                    url,
                    prefix=env["CONVOQ_PREFIX"],
                    callback_allowed_networks=LOOPBACK,
                    webhook_secret=secret,
                )
            )
            log, options = home / "worker.log", ["--concurrency=8", "--loglevel=warning"]
            stack.enter_context(
                worker_process(WORKER_NAME, env, log, *options, registered=client.workers)
            )
            web, key = stack.enter_context(gateway_server(env)) if gateway else ("", "")
        where = f"\ngateway {web}\ninbox   {web}/inbox#key={key}" if gateway else ""
        out.print(
            Panel(f"Redis   {url}\nworker  {WORKER_NAME}, {mode}{where}", title="convoq demo")
        )
        _conversations(out, client)
        _events(out, client)
        _approval(out, client)
        _webhook(out, client, hook_url, hooks, secret)
        _history(out, client)
        if gateway:
            http_turn(out, web, key)
        else:
            out.print(
                "the HTTP gateway part needs pip install 'convoq[gateway]'",
                style="dim",
                markup=False,
            )
        if serve:
            _serve(out, client, web, key)
        out.print("[dim]stopping the worker and the embedded Redis...[/dim]")
    out.print(f"[bold green]demo finished in {time.monotonic() - started:.1f}s[/bold green]")
    return 0


def _serve(out: Console, client: Client, web: str, key: str) -> None:
    client.submit("web-demo", "Send 7 EUR to Frank", agent="banker")
    out.print(f"[bold]Serving.[/bold] Approve the parked transfer at {web}/inbox#key={key}")
    out.print(f"  or: curl -H 'Authorization: Bearer {key}' {web}/v1/approvals")
    out.print("  Ctrl-C stops everything.")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        out.print()


def _worker_env(url: str, home: Path, secret: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOQ_")}
    env.update(
        CONVOQ_REDIS_URL=url,
        CONVOQ_PREFIX=f"demo{secrets.token_hex(3)}",
        CONVOQ_AGENTS="convoq.cli.demo_agents",
        CONVOQ_HOME=str(home),
        CONVOQ_WEBHOOK_SECRET=secret,
        # The demo's webhook receiver listens on loopback, which callbacks may not reach
        # unless allowed.
        CONVOQ_CALLBACK_ALLOWED_NETWORKS=LOOPBACK,
        CONVOQ_WEBHOOK_RETRY_BASE_S="0.5",
    )
    return env


def _gateway_installed() -> bool:
    """Whether the gateway's web stack (the ``gateway`` extra) is installed."""
    return all(importlib.util.find_spec(name) is not None for name in ("fastapi", "uvicorn"))

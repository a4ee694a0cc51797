"""``convoq``: run workers, submit and follow turns, decide approvals, run the demo.

Settings come from ``ConvoqSettings`` (``CONVOQ_*`` environment variables); options given
here override them. This module parses, calls the library and prints; nothing else.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from convoq.client import Client, TurnResult
from convoq.engine import TurnEvent
from convoq.errors import ConvoqError
from convoq.loaders import load_image, load_pdf
from convoq.messages import Message, MessageRole, TextPart
from convoq.settings import ConvoqSettings

app = typer.Typer(
    name="convoq",
    help="AI-agent conversations as queued, durable work (Celery workers, Redis memory).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

_STATUS_STYLE = {
    "queued": "yellow",
    "running": "cyan",
    "awaiting_approval": "magenta",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "dim",
}


def _settings(**overrides: Any) -> ConvoqSettings:
    values = {k: v for k, v in overrides.items() if v is not None}
    return ConvoqSettings(**values)


def _client(settings: ConvoqSettings | None = None) -> Client:
    s = settings or _settings()
    return Client(
        s.redis_url,
        broker_url=s.broker_url,
        prefix=s.prefix,
        partitions=s.partitions,
        webhook_secret=s.webhook_secret,
        max_attachment_bytes=s.max_attachment_bytes,
        max_turn_bytes=s.max_turn_bytes,
        home=s.home,
    )


def _fail(exc: ConvoqError) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {escape(exc.message)}", soft_wrap=True)
    return typer.Exit(1)


# -- workers ------------------------------------------------------------------------------
@app.command()
def worker(
    partitions: Annotated[
        str | None, typer.Option(help="Partitions to consume: all (default), 0-7, 1,3,5-6.")
    ] = None,
    concurrency: Annotated[int | None, typer.Option(help="Turns in flight per process.")] = None,
    agents: Annotated[str | None, typer.Option(help="Module(s) with the agent profiles.")] = None,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "info",
    hostname: Annotated[str | None, typer.Option(help="Worker name (name@host).")] = None,
) -> None:
    """Run a worker process (Celery, threads pool) for the chosen partitions."""
    from convoq.worker.app import create_app  # lazy: worker side only here
    from convoq.worker.profiles import load_profiles
    from convoq.worker.routing import parse_partitions, queue_names

    try:
        s = _settings(concurrency=concurrency, agents=agents)
        profiles = load_profiles(s.agents)
        queues = queue_names(s.prefix, parse_partitions(partitions, s.partitions))
        celery_app = create_app(s)
    except ConvoqError as exc:
        raise _fail(exc) from None
    err_console.print(
        f"[bold]convoq worker[/bold]: profiles {sorted(profiles)}, queues {queues[0]}..{queues[-1]}"
        f" ({len(queues)}), {s.concurrency} turns in flight"
    )
    argv = [
        "worker",
        "--pool=threads",
        f"--concurrency={s.concurrency}",
        f"--queues={','.join(queues)}",
        f"--loglevel={loglevel}",
        f"--hostname={hostname or f'convoq-{os.getpid()}@%h'}",
        "--without-mingle",
        "--without-gossip",
    ]
    celery_app.worker_main(argv)


@app.command()
def flower(
    port: Annotated[int | None, typer.Option(help="HTTP port (CONVOQ_FLOWER_PORT).")] = None,
    address: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    basic_auth: Annotated[
        list[str] | None,
        typer.Option(help="user:password allowed in (repeatable; CONVOQ_FLOWER_BASIC_AUTH)."),
    ] = None,
) -> None:
    """Run Flower (the Celery dashboard and HTTP API) on convoq's broker."""
    from convoq.worker.app import create_app

    s = _settings()
    argv = ["flower", f"--port={port or s.flower_port}", f"--address={address}"]
    users = basic_auth or [u for u in (s.flower_basic_auth or "").split(",") if u]
    argv += [f"--basic-auth={item}" for item in users]
    # Flower needs the broker, events and remote control; no agent profiles are loaded.
    celery_app = create_app(s)
    raise typer.Exit(celery_app.start(argv) or 0)


@app.command()
def redis(
    home: Annotated[Path | None, typer.Option(help="Data directory (CONVOQ_HOME).")] = None,
) -> None:
    """Run the embedded redis-server in the foreground (AOF on), until Ctrl-C."""
    from convoq.redis import embedded

    embedded.run_foreground(home or _settings().home)


@app.command()
def demo() -> None:
    """Run the whole stack on an embedded Redis: worker, turns, attachments, approval."""
    from convoq.demo import run_demo

    raise typer.Exit(run_demo(console))


# -- turns --------------------------------------------------------------------------------
@app.command()
def submit(
    conversation_id: str,
    text: str,
    agent: Annotated[str, typer.Option(help="Agent profile name.")] = "assistant",
    image: Annotated[list[Path] | None, typer.Option(help="Attach an image (repeatable).")] = None,
    pdf: Annotated[list[Path] | None, typer.Option(help="Attach a PDF (repeatable).")] = None,
    wait: Annotated[bool, typer.Option(help="Wait for the result and print it.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds --wait waits.")] = 120.0,
    idempotency_key: Annotated[str | None, typer.Option(help="Submit at most once.")] = None,
    keep_last_turns: Annotated[int | None, typer.Option(help="Previous turns sent.")] = None,
    callback_url: Annotated[str | None, typer.Option(help="Signed POST when done.")] = None,
) -> None:
    """Queue a turn; print its id (and with --wait, its result)."""
    s = _settings()
    try:
        parts: list[Any] = [TextPart(text=text)]
        parts += [load_image(p, max_bytes=s.max_attachment_bytes) for p in image or []]
        parts += [load_pdf(p, max_bytes=s.max_attachment_bytes) for p in pdf or []]
        with _client(s) as client:
            handle = client.submit(
                conversation_id,
                Message(role=MessageRole.USER, content=parts),
                agent=agent,
                idempotency_key=idempotency_key,
                keep_last_turns=keep_last_turns,
                callback_url=callback_url,
            )
            console.print(f"turn [bold]{handle.turn_id}[/bold] queued for {conversation_id}")
            if wait:
                with console.status(f"waiting for turn {handle.turn_id}..."):
                    result = handle.wait(timeout, raise_on_error=False, return_on_approval=True)
                _print_result(result)
                if result.status in ("failed", "cancelled"):
                    raise typer.Exit(1)
    except ConvoqError as exc:
        raise _fail(exc) from None


@app.command()
def watch(
    conversation_id: str,
    turn_id: str,
    timeout: Annotated[float | None, typer.Option(help="Give up after this many seconds.")] = None,
) -> None:
    """Stream a turn's events until it is done."""
    try:
        with _client() as client:
            for event in client.handle(conversation_id, turn_id).events(timeout=timeout):
                _print_event(event)
    except ConvoqError as exc:
        raise _fail(exc) from None


@app.command()
def status(conversation_id: str, turn_id: str) -> None:
    """Print a turn's status (and its answer, error or pending approvals)."""
    try:
        with _client() as client:
            _print_result(client.handle(conversation_id, turn_id).result())
    except ConvoqError as exc:
        raise _fail(exc) from None


@app.command()
def history(
    conversation_id: str,
    last: Annotated[int | None, typer.Option(help="Only the last N turns.")] = None,
) -> None:
    """Print a conversation's stored messages."""
    try:
        with _client() as client:
            messages = client.history(conversation_id, last_turns=last)
    except ConvoqError as exc:
        raise _fail(exc) from None
    console.print(f"{conversation_id}: {len(messages)} messages")
    if messages:
        table = Table("role", "content")
        for message in messages:
            table.add_row(message.role.value, escape(describe_message(message)))
        console.print(table)


@app.command()
def approve(conversation_id: str, turn_id: str, call_id: str) -> None:
    """Approve a parked tool call."""
    _decide(conversation_id, turn_id, call_id, approved=True, reason=None)


@app.command()
def deny(
    conversation_id: str,
    turn_id: str,
    call_id: str,
    reason: Annotated[str | None, typer.Option(help="Told to the model.")] = None,
) -> None:
    """Deny a parked tool call."""
    _decide(conversation_id, turn_id, call_id, approved=False, reason=reason)


def _decide(cid: str, tid: str, call_id: str, *, approved: bool, reason: str | None) -> None:
    try:
        with _client() as client:
            handle = client.handle(cid, tid)
            if approved:
                client.approve(handle, call_id)
            else:
                client.deny(handle, call_id, reason=reason)
    except ConvoqError as exc:
        raise _fail(exc) from None
    console.print(f"{'approved' if approved else 'denied'} {call_id} of turn {tid}")


@app.command()
def cancel(conversation_id: str, turn_id: str) -> None:
    """Cancel a queued or running turn (a parked one is discarded)."""
    try:
        with _client() as client:
            outcome = client.cancel(client.handle(conversation_id, turn_id))
    except ConvoqError as exc:
        raise _fail(exc) from None
    console.print(f"turn {turn_id}: {outcome}")


@app.command()
def clear(
    conversation_id: str,
    force: Annotated[bool, typer.Option(help="Clear even while a turn runs or waits.")] = False,
) -> None:
    """Delete a conversation's history and turns."""
    try:
        with _client() as client:
            client.clear(conversation_id, force=force)
    except ConvoqError as exc:
        raise _fail(exc) from None
    console.print(f"cleared {conversation_id}")


# -- printing -----------------------------------------------------------------------------
def describe_message(message: Message) -> str:
    """One line for a message: text, tool calls, attachments (never their bytes)."""
    bits = [message.text] if message.text else []
    bits += [f"[{p.mime_type}, {len(p.data)} bytes]" for p in message.attachments]
    bits += [f"-> {c.name}({c.arguments})" for c in message.tool_calls]
    return " ".join(bits)


def _print_result(result: TurnResult) -> None:
    style = _STATUS_STYLE.get(result.status, "")
    console.print(f"status: [{style}]{result.status}[/{style}]")
    if result.text:
        console.print(escape(result.text))
    if result.error is not None:
        console.print(f"[red]{type(result.error).__name__}: {escape(result.error.message)}[/red]")
    for call in result.pending_approvals:
        shown = escape(f"{call.id} {call.name}({call.arguments})")
        console.print(f"[magenta]needs approval[/magenta]: {shown}")


def _print_event(event: TurnEvent) -> None:
    data = event.data
    if event.type == "text_delta":
        console.print(escape(str(data.get("text", ""))), end="")
        return
    if event.type == "status":
        status_ = str(data.get("status"))
        style = _STATUS_STYLE.get(status_, "")
        console.print(f"\n[{style}]● {status_}[/{style}]")
    elif event.type in ("tool_call", "approval_required"):
        shown = escape(f"{data.get('id')} {data.get('name')}({data.get('arguments')})")
        console.print(f"\n[magenta]{event.type}[/magenta] {shown}")
    elif event.type == "tool_result":
        shown = escape(f"{data.get('name')}: {data.get('result')}")
        console.print(f"\n[blue]tool_result[/blue] {shown}")
    elif event.type == "done":
        console.print(f"\n[bold]done[/bold]: {data.get('status')}")


def main() -> None:
    """The ``convoq`` entry point."""
    app(prog_name="convoq")


if __name__ == "__main__":
    main()

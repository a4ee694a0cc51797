"""``convoq``: run workers, submit and follow turns, decide approvals, run the demo.

Settings come from ``ConvoqSettings`` (``CONVOQ_*`` environment variables); options given
here override them. This module parses, calls the library and prints; nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, get_args

import typer

from convoq.cli import _scheduled, _transfer, _waits
from convoq.cli._asks import submit_asks
from convoq.cli._render import (
    console,
    err_console,
    fail,
    login_name,
    parse_json_option,
    print_deployment,
    print_error,
    print_event,
    print_history,
    print_result,
    print_workers,
    reported,
)
from convoq.cli._usage import OneLineUsage, plain_help
from convoq.client import Client, TurnHandle
from convoq.client._base import IfBusy, check_if_busy
from convoq.context import check_metadata
from convoq.errors import ConfigurationError, ConversationBusyError, ConvoqError
from convoq.loaders import load_image, load_pdf
from convoq.messages import Message, MessageRole, TextPart
from convoq.settings import ConvoqSettings

app = typer.Typer(
    name="convoq",
    help="AI-agent conversations as queued, durable work (Celery workers, Redis memory).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=OneLineUsage,
)


def _settings(**overrides: Any) -> ConvoqSettings:
    try:
        return ConvoqSettings.resolve(**overrides)
    except ConfigurationError as exc:
        # A bad CONVOQ_* value is a configuration error, not a traceback.
        problems = exc.details.get("problems", [exc.message])
        for problem in problems[:-1]:
            print_error(problem)
        raise fail(problems[-1], 2) from None


@contextmanager
def _connected(settings: ConvoqSettings | None = None) -> Iterator[Client]:
    """A Client on the configured Redis and broker; ConvoqErrors reported (exit code 1)."""
    s = settings or _settings()
    with reported():
        client = Client(settings=s)
        with client:
            yield client


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
    pool: Annotated[
        str | None, typer.Option(help="The pool this worker is (CONVOQ_POOL): its queues.")
    ] = None,
) -> None:
    """Run a worker process (Celery, threads pool) for the chosen partitions."""
    from convoq.queue.routing import parse_partitions, queue_names
    from convoq.worker.app import create_app  # lazy: worker side only here
    from convoq.worker.profiles import load_profiles

    s = _settings(concurrency=concurrency, agents=agents, pool=pool)
    with reported(code=2):
        chosen = parse_partitions(partitions, s.partitions)
    with reported():
        profiles = load_profiles(s.agents)
        queues = queue_names(s.prefix, chosen, s.pool)
        celery_app = create_app(s)
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
def gateway(
    host: Annotated[str | None, typer.Option(help="Address (CONVOQ_GATEWAY_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (CONVOQ_GATEWAY_PORT).")] = None,
) -> None:
    """Serve the client API over HTTP and the approvals inbox (keys: CONVOQ_GATEWAY_API_KEYS)."""
    try:
        import uvicorn

        from convoq.gateway import create_app
    except ImportError as exc:
        err_console.print(
            f"[red]error:[/red] {exc}: install the extra: pip install 'convoq[gateway]'"
        )
        raise typer.Exit(2) from None
    s = _settings(gateway_host=host, gateway_port=port)
    with reported():
        asgi = create_app(s)
    if not s.gateway_api_keys:
        err_console.print("[yellow]warning:[/yellow] CONVOQ_GATEWAY_API_KEYS is empty:"
                          " every request will be refused (401)")  # fmt: skip
    uvicorn.run(asgi, host=s.gateway_host, port=s.gateway_port, log_level="info")


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
    with reported():
        celery_app = create_app(s)
    raise typer.Exit(celery_app.start(argv) or 0)


redis_app = typer.Typer()
app.add_typer(redis_app, name="redis")
HomeOption = Annotated[Path | None, typer.Option(help="Data directory (CONVOQ_HOME).")]


@redis_app.callback(invoke_without_command=True)
def redis(ctx: typer.Context, home: HomeOption = None) -> None:
    """Run the embedded redis-server in the foreground (AOF on) until Ctrl-C or SIGTERM;
    `convoq redis stop` stops one left running by a client, worker or command."""
    if ctx.invoked_subcommand is not None:
        return
    from convoq.redis import embedded

    with reported():
        embedded.run_foreground(home or _settings().home)


@redis_app.command("stop")
def redis_stop(home: HomeOption = None) -> None:
    """Stop the embedded redis-server under CONVOQ_HOME (its data stays on disk)."""
    from convoq.redis import embedded

    where = Path(home or _settings().home).resolve()
    with reported():
        stopped = embedded.stop(where)
    shown = f"the embedded redis-server under {where}"
    err_console.print(f"stopped {shown}" if stopped else f"{shown} was not running")


@app.command()
def demo(
    serve: Annotated[
        bool, typer.Option(help="Then keep the worker and gateway up (try the inbox page).")
    ] = False,
) -> None:
    """Run the whole stack on an embedded Redis: worker, turns, attachments, approval,
    and the HTTP gateway with its approvals inbox."""
    from convoq.cli.demo import run_demo

    _settings()  # a bad CONVOQ_* value is one line here, not a traceback from the client
    with reported():
        code = run_demo(console, serve=serve)
    raise typer.Exit(code)


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
    max_history_tokens: Annotated[
        int | None, typer.Option(help="Send the newest whole turns that fit this many tokens.")
    ] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Tokens the answer may use.")] = None,
    model_settings: Annotated[
        str | None, typer.Option(help="Model settings as JSON, e.g. '{\"seed\": 7}'.")
    ] = None,
    output_schema: Annotated[
        str | None, typer.Option(help="JSON schema of the object the answer must fit.")
    ] = None,
    metadata: Annotated[
        str | None,
        typer.Option(help='A JSON object its tools see as ctx.metadata: {"user": "ada"}'),
    ] = None,
    if_busy: Annotated[
        str,
        typer.Option(
            help="While a turn is in progress: queue behind it, reject, interrupt it, roll it"
            " back, or merge into a queued one (docs/double-texting.md).",
        ),
    ] = "queue",
    delay: _scheduled.DelayOption = None,
    at: _scheduled.AtOption = None,
) -> None:
    """Queue a turn; print its id on stdout (and with --wait, its result: final, or parked
    awaiting approval). With --if-busy merge, the id printed is the turn that answers it.
    With --delay or --at it is scheduled: it joins the conversation's line then (convoq
    scheduled lists it, convoq cancel cancels it)."""
    s = _settings()
    # Options, attachments and metadata are checked before any connection: usage errors.
    with reported(code=2):
        asked = submit_asks(model_settings, output_schema, temperature, max_tokens)
        meta = check_metadata(parse_json_option("--metadata", metadata))
        busy = _if_busy(if_busy)
        when = _scheduled.schedule_asks(delay, at)
        parts: list[Any] = [TextPart(text=text)]
        parts += [load_image(p, max_bytes=s.max_attachment_bytes) for p in image or []]
        parts += [load_pdf(p, max_bytes=s.max_attachment_bytes) for p in pdf or []]
    with _connected(s) as client:
        handle = client.submit(
            conversation_id,
            Message(role=MessageRole.USER, content=parts),
            agent=agent,
            idempotency_key=idempotency_key,
            keep_last_turns=keep_last_turns,
            callback_url=callback_url,
            max_history_tokens=max_history_tokens,
            **asked,
            metadata=meta,
            if_busy=busy,
            **when,
        )
        # The bare id on stdout, so TID=$(convoq submit ...) works; the note goes to stderr.
        print(handle.turn_id, flush=True)
        if handle.merged_from:
            err_console.print(f"merged into turn {handle.turn_id} (as {handle.merged_from})")
        else:
            done = "scheduled" if when else "queued"
            err_console.print(f"turn {handle.turn_id} {done} for {conversation_id}")
        if wait:
            _wait_and_print(handle, timeout)


def _if_busy(value: str) -> IfBusy:
    """``--if-busy``, checked: a usage error names the option and its values."""
    if value not in get_args(IfBusy):
        raise ConvoqError(f"--if-busy must be one of {', '.join(get_args(IfBusy))}, not {value!r}")
    return check_if_busy(value)


def _wait_and_print(handle: TurnHandle, timeout: float) -> None:
    """``--wait``: the turn's result once it settles (exit code 1 unless it succeeded or
    is parked awaiting approval)."""
    with err_console.status(f"waiting for turn {handle.turn_id}..."):
        result = handle.wait(timeout, raise_on_error=False)
    print_result(result)
    if result.status in ("failed", "cancelled", "expired", "blocked", "interrupted"):
        raise typer.Exit(1)


@app.command()
def retry(
    conversation_id: str,
    turn_id: str,
    wait: Annotated[bool, typer.Option(help="Wait for the result and print it.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds --wait waits.")] = 120.0,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Retry at most once for this key.")
    ] = None,
) -> None:
    """Run a failed turn again, as the same turn: at the back of its conversation's line,
    the steps it finished not run again (its tools keep their idempotency keys). A turn
    that did not fail is refused, and nothing changes."""
    with _connected() as client:
        handle = client.retry(
            client.handle(conversation_id, turn_id), idempotency_key=idempotency_key
        )
        again = "already queued again by that key" if handle.repeated else "queued again"
        err_console.print(f"turn {turn_id} of {conversation_id} {again}")
        if wait:
            _wait_and_print(handle, timeout)


@app.command()
def watch(
    conversation_id: str,
    turn_id: str,
    timeout: Annotated[float | None, typer.Option(help="Give up after this many seconds.")] = None,
) -> None:
    """Stream a turn's events until it is done."""
    with _connected() as client:
        for event in client.handle(conversation_id, turn_id).events(timeout=timeout):
            print_event(event)


@app.command()
def status(
    conversation_id: Annotated[str | None, typer.Argument(show_default=False)] = None,
    turn_id: Annotated[str | None, typer.Argument(show_default=False)] = None,
) -> None:
    """Print a turn's status (and its answer, error or pending approvals); without
    arguments, the deployment: which Redis, its workers alive and dead, and a warning
    when no worker would take a turn."""
    if (conversation_id is None) != (turn_id is None):
        raise typer.BadParameter(
            "give both, or neither for the deployment", param_hint="CONVERSATION_ID TURN_ID"
        )
    with _connected() as client:
        if conversation_id is None or turn_id is None:
            print_deployment(client.deployment())
        else:
            print_result(client.handle(conversation_id, turn_id).result())


@app.command()
def workers() -> None:
    """List the registered workers: alive or dead (missed 3 heartbeats), when last seen,
    their agents and queues (a dead one is dropped after 12 missed heartbeats)."""
    with _connected() as client:
        found = client.workers()
    if found:
        print_workers(found)
    else:
        err_console.print(f"no worker is registered on {client.async_client.redis_named()}")


@app.command()
def history(
    conversation_id: str,
    last: Annotated[int | None, typer.Option(help="Only the last N turns.")] = None,
    usage: Annotated[
        bool, typer.Option("--usage", help="Tokens per model answer and for the conversation.")
    ] = False,
) -> None:
    """Print a conversation's stored messages."""
    with _connected() as client:
        messages = client.history(conversation_id, last_turns=last)
        print_history(conversation_id, messages, client.usage(conversation_id) if usage else None)


_BY_HELP = "Who decides (kept with the decision); default: your login name."


@app.command()
def approve(
    conversation_id: str,
    turn_id: str,
    call_id: str,
    by: Annotated[str | None, typer.Option(help=_BY_HELP)] = None,
    reason: Annotated[str | None, typer.Option(help="Why (kept with the decision).")] = None,
) -> None:
    """Approve a parked tool call."""
    with _connected() as client:
        handle = client.handle(conversation_id, turn_id)
        client.approve(handle, call_id, by=by if by is not None else login_name(), reason=reason)
    console.print(f"approved {call_id} of turn {turn_id}")


@app.command()
def deny(
    conversation_id: str,
    turn_id: str,
    call_id: str,
    reason: Annotated[str | None, typer.Option(help="Told to the model.")] = None,
    by: Annotated[str | None, typer.Option(help=_BY_HELP)] = None,
) -> None:
    """Deny a parked tool call."""
    with _connected() as client:
        handle = client.handle(conversation_id, turn_id)
        client.deny(handle, call_id, reason=reason, by=by if by is not None else login_name())
    console.print(f"denied {call_id} of turn {turn_id}")


@app.command()
def cancel(conversation_id: str, turn_id: str) -> None:
    """Cancel a queued, scheduled or running turn (a parked one is discarded)."""
    with _connected() as client:
        outcome = client.cancel(client.handle(conversation_id, turn_id))
    console.print(f"turn {turn_id}: {outcome}")


@app.command()
def clear(
    conversation_id: str,
    force: Annotated[bool, typer.Option(help="Clear even while a turn runs or waits.")] = False,
) -> None:
    """Delete a conversation's history and turns."""
    with _connected() as client:
        try:
            client.clear(conversation_id, force=force)
        except ConversationBusyError:
            # The library's message names its own keyword; here the option is --force.
            raise fail(
                f"conversation {conversation_id!r} has turns queued, running or awaiting"
                " approval; wait, cancel them (convoq cancel), or pass --force"
            ) from None
    console.print(f"cleared {conversation_id}")


_transfer.register(app, _settings)
_waits.register(app, _connected)
_scheduled.register(app, _connected)
plain_help(app)  # last: every command is registered


def main() -> None:
    """The ``convoq`` entry point."""
    app(prog_name="convoq")

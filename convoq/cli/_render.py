"""What ``convoq`` prints: turn results, events, stored messages (never attachment bytes)
and errors, on one console for output and one for errors."""

from __future__ import annotations

import getpass
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import typer
from kombu.exceptions import OperationalError as BrokerUnreachable
from redis.exceptions import InvalidResponse, RedisError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from convoq.client import Deployment, TurnResult
from convoq.errors import ConvoqError
from convoq.messages import Decision, Message
from convoq.redis._base import REDIS_UNAVAILABLE
from convoq.turn_state import TurnEvent
from convoq.usage import Usage

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

STATUS_STYLE = {
    "scheduled": "blue",
    "queued": "yellow",
    "running": "cyan",
    "awaiting_approval": "magenta",
    "waiting": "magenta",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "dim",
    "expired": "red",
    "blocked": "red",
    "interrupted": "yellow",
    "merged": "dim",
}


def print_error(message: str) -> None:
    """``error: message`` on one line of stderr."""
    err_console.print(f"[red]error:[/red] {escape(' '.join(message.split()))}", soft_wrap=True)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``message`` as an error; return the Exit to raise (1: runtime, 2: usage)."""
    print_error(message)
    return typer.Exit(code)


@contextmanager
def reported(code: int = 1) -> Iterator[None]:
    """A ConvoqError inside, or a Redis or broker that cannot be reached or answers an
    error, becomes one line on stderr and exit code 1; ``code=2`` around the checks of the
    command line itself (a bad option value is a usage error, as click's own are)."""
    try:
        yield
    except ConvoqError as exc:
        raise fail(exc.message, code) from None
    except REDIS_UNAVAILABLE as exc:
        raise fail(
            f"Redis does not answer ({str(exc).rstrip('.')}); start it, or point"
            " CONVOQ_REDIS_URL at one that runs"
        ) from None
    except InvalidResponse as exc:
        raise fail(
            f"the server at CONVOQ_REDIS_URL does not speak the Redis protocol ({exc});"
            " point CONVOQ_REDIS_URL at a Redis server"
        ) from None
    except RedisError as exc:
        raise fail(f"Redis refused the command ({exc}); check CONVOQ_REDIS_URL") from None
    except BrokerUnreachable as exc:
        raise fail(
            f"the broker does not answer ({str(exc).rstrip('.')}); start it, or point"
            " CONVOQ_BROKER_URL at one that runs"
        ) from None


def parse_json_option(option: str, raw: str | None) -> Any:
    """The JSON value an option holds (None when not given); ConvoqError if not JSON."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ConvoqError(f'{option} must be JSON, e.g. \'{{"user": "ada"}}\' ({exc})') from None


def login_name() -> str | None:
    """Who runs this command, for the decisions it records (None when unknown)."""
    try:
        return getpass.getuser() or None
    except (OSError, KeyError):
        return None


def describe_decision(decision: Decision) -> str:
    """Who decided a tool call, when and why (or that its approval expired)."""
    when = ""
    if decision.at_ms is not None:
        stamp = datetime.fromtimestamp(decision.at_ms / 1000, UTC)
        when = f" at {stamp:%Y-%m-%d %H:%M:%S} UTC"
    if decision.expired:
        return f"approval expired{when}"
    verb = "approved" if decision.approved else "denied"
    who = f" by {decision.by}" if decision.by else ""
    why = f": {decision.reason}" if decision.reason else ""
    return f"{verb}{who}{when}{why}"


def describe_message(message: Message) -> str:
    """One line for a message: text, tool calls, attachments (never their bytes)."""
    bits = [message.text] if message.text else []
    bits += [f"[{p.mime_type}, {len(p.data)} bytes]" for p in message.attachments]
    bits += [f"-> {c.name}({c.arguments})" for c in message.tool_calls]
    return " ".join(bits)


def print_history(
    conversation_id: str, messages: list[Message], usage: Usage | None = None
) -> None:
    """A conversation's messages as a table of role and content, then who decided each
    tool call that waited for approval; with ``usage`` (the conversation's totals) each
    model answer shows the tokens its call reported."""
    console.print(f"{conversation_id}: {len(messages)} messages")
    if messages:
        table = Table("role", "content", *(["tokens"] if usage is not None else []))
        for message in messages:
            row = [message.role.value, escape(describe_message(message))]
            if usage is not None:
                row.append(describe_usage(message.usage) if message.usage else "")
            table.add_row(*row)
        console.print(table)
    for message in messages:  # the audit trail of calls that waited for approval
        if message.decision is not None:
            call = f"{message.tool_call_id} ({message.name})"
            console.print(
                f"decision on {escape(call)}: {escape(describe_decision(message.decision))}"
            )
    if usage is not None:
        console.print(f"usage: {usage.requests} model calls, {describe_usage(usage)}")


def describe_usage(usage: Usage) -> str:
    """Token counts in one line (cached and reasoning ones when there are any)."""
    text = f"{usage.prompt_tokens} prompt + {usage.completion_tokens} completion"
    text += f" = {usage.total_tokens} tokens"
    extra = [f"{usage.cached_tokens} cached"] if usage.cached_tokens else []
    extra += [f"{usage.reasoning_tokens} reasoning"] if usage.reasoning_tokens else []
    return text + (f" ({', '.join(extra)})" if extra else "")


def print_result(result: TurnResult) -> None:
    """A turn's status and its answer, error or pending approvals."""
    style = STATUS_STYLE.get(result.status, "default")  # "[]...[/]" is no markup
    console.print(f"status: [{style}]{result.status}[/{style}]")
    if result.text:
        console.print(escape(result.text))
    if result.error is not None:
        console.print(f"[red]{type(result.error).__name__}: {escape(result.error.message)}[/red]")
    for call in result.pending_approvals:
        shown = escape(f"{call.id} {call.name}({call.arguments})")
        console.print(f"[magenta]needs approval[/magenta]: {shown}")
    if result.handed_from is not None:
        console.print(escape(f"handed off: {result.handed_from} -> {result.agent}"))
    if result.parent is not None:
        p = result.parent
        console.print(escape(f"sub-agent call {p.call_id} of {p.conversation_id} {p.turn_id}"))
    for child in result.children:
        said = f"{child.call_id} {child.agent}: {child.status}, {child.usage.requests} model calls"
        console.print(escape(f"child {said}, {child.conversation_id} {child.turn_id}"))
    if result.children:
        console.print(f"usage with children: {describe_usage(result.usage)}")


def _call(data: dict[str, Any]) -> str:
    return f"{data.get('id')} {data.get('name')}({data.get('arguments')})"


# Event type -> its style and what it shows of the event's data (text deltas and statuses
# are printed apart: a delta unbroken as it comes, a status in its own colour).
_EVENT_LINES: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "tool_call": ("magenta", _call),
    "approval_required": ("magenta", _call),
    "decision": ("magenta", lambda d: f"{d.get('call_id')}: "
                 f"{describe_decision(Decision.model_validate(d))}"),
    "tool_result": ("blue", lambda d: f"{d.get('name')}: {d.get('result')}"),
    "resumed": ("yellow", lambda d: f"{d.get('reason')} (attempt {d.get('attempt')})"),
    # The model call's text starts again.
    "text_retracted": ("yellow", lambda d: "(the model call is retried; its text again:)"),
    # A failed turn queued again, as the same turn.
    "retried": ("yellow", lambda d: f"(retry {d.get('retry')})"),
    "subagent_call": ("magenta", lambda d: f"{d.get('id')} {d.get('agent')} ->"
                      f" {d.get('conversation_id')} {d.get('turn_id')}"),
    "handoff": ("magenta", lambda d: f"{d.get('from')} -> {d.get('to')}"),
    "guardrail_tripped": ("red", lambda d: f"{d.get('kind')} {d.get('guardrail')}:"
                          f" {d.get('reason')}"),
    # Waits for the world (convoq.waits): what a call waits for, and what ended the wait.
    "deferred": ("magenta", lambda d: f"{d.get('call_id')} {d.get('name')} waits for "
                 + (f"signal {d.get('signal')}" if d.get("on") == "signal" else "a result")),
    "result_supplied": ("magenta", lambda d: f"{d.get('call_id')}"
                        + (" (error)" if d.get("is_error") else "")
                        + (f" by {d.get('by')}" if d.get("by") else "")),
    "signal_delivered": ("magenta", lambda d: f"{d.get('call_id')}: signal {d.get('signal')}"
                         + (f" from {d.get('by')}" if d.get("by") else "")),
    # Double texting.
    "stop_requested": ("yellow", lambda d: " ".join(f"{k}={v}" for k, v in d.items())),
    "merged": ("yellow", lambda d: " ".join(f"{k}={v}" for k, v in d.items())),
}  # fmt: skip


def print_event(event: TurnEvent) -> None:
    """One event of a turn's stream; text deltas are printed as they come, unbroken."""
    data = event.data
    if event.type == "text_delta":
        console.print(escape(str(data.get("text", ""))), end="")
    elif event.type == "status":
        status = str(data.get("status"))
        style = STATUS_STYLE.get(status, "default")
        console.print(f"\n[{style}]● {status}[/{style}]")
    elif event.type == "done":
        console.print(f"\n[bold]done[/bold]: {data.get('status')}")
    elif (line := _EVENT_LINES.get(event.type)) is not None:
        style, shown = line
        console.print(f"\n[{style}]{event.type}[/{style}] {escape(shown(data))}")


def print_workers(workers: dict[str, dict[str, Any]]) -> None:
    """The registered workers as a table: alive or dead, when last seen, what they run."""
    table = Table("worker", "alive", "last seen", "pid", "agents", "queues")
    for name, info in sorted(workers.items()):
        seen = info.get("last_seen_s")
        alive = "[green]yes[/green]" if info.get("alive") else "[red]dead[/red]"
        queues = info.get("queues") or []
        shown = f"{queues[0]}..{queues[-1]} ({len(queues)})" if len(queues) > 1 else queues
        table.add_row(
            escape(name),
            alive,
            f"{seen:g}s ago" if isinstance(seen, (int, float)) else "never",
            str(info.get("pid", "")),
            escape(", ".join(info.get("agents") or [])),
            escape(str(shown if queues else "")),
        )
    console.print(table)


def print_deployment(found: Deployment) -> None:
    """Which Redis and prefix, its workers alive and dead, and why turns would wait for
    ever (a warning on stderr) when no worker is alive."""
    alive = len(found.alive)
    console.print(f"redis: {escape(found.redis)}")
    console.print(f"prefix: {escape(found.prefix)}")
    console.print(f"workers: {alive} alive, {len(found.workers) - alive} dead")
    if found.workers:
        print_workers(found.workers)
    problem = found.problem()
    if problem is not None:
        err_console.print(f"[yellow]warning:[/yellow] {escape(problem)}", soft_wrap=True)

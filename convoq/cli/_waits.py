"""``convoq complete-call`` / ``convoq signal``: answer a turn that waits for the world
(:mod:`convoq.waits`), a deferred call's result or a conversation's signal."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Annotated

import typer

from convoq.cli._render import console, login_name, parse_json_option, reported
from convoq.client import Client

Connect = Callable[[], AbstractContextManager[Client]]
_BY_HELP = "Who sends it (default: your login name)."


def register(app: typer.Typer, connected: Connect) -> None:
    """Add the two commands to ``app``; ``connected()`` opens the configured client."""

    @app.command("complete-call")
    def complete_call(
        conversation_id: str,
        turn_id: str,
        call_id: str,
        result: Annotated[
            str | None,
            typer.Argument(help="The call's result as JSON (a JSON string reads as it is)."),
        ] = None,
        error: Annotated[
            str | None, typer.Option(help="The call failed: the error the model reads.")
        ] = None,
        by: Annotated[str | None, typer.Option(help=_BY_HELP)] = None,
    ) -> None:
        """Supply the result of a deferred tool call; the turn resumes once nothing else
        is missing."""
        with reported():
            value = parse_json_option("RESULT", result)
        with connected() as client:
            handle = client.handle(conversation_id, turn_id)
            sender = by if by is not None else login_name()
            outcome = client.complete_call(handle, call_id, value, error=error, by=sender)
        said = "the turn resumes" if outcome == "resume" else "other calls still wait"
        console.print(f"result of {call_id} of turn {turn_id} recorded: {said}")

    @app.command("signal")
    def send_signal(
        conversation_id: str,
        name: str,
        payload: Annotated[str | None, typer.Argument(help="The payload as JSON.")] = None,
        signal_id: Annotated[
            str | None, typer.Option("--id", help="The same id again is a duplicate.")
        ] = None,
        by: Annotated[str | None, typer.Option(help=_BY_HELP)] = None,
    ) -> None:
        """Send a signal to the conversation's turn waiting for it (or keep it for the
        next wait on that name)."""
        with reported():
            value = parse_json_option("PAYLOAD", payload)
        with connected() as client:
            sender = by if by is not None else login_name()
            sent = client.signal(conversation_id, name, value, signal_id=signal_id, by=sender)
        if sent.outcome == "delivered":
            console.print(f"signal {name!r} delivered to {sent.call_id} of turn {sent.turn_id}")
        elif sent.outcome == "kept":
            console.print(f"signal {name!r} kept for the next wait ({sent.kept} kept)")
        else:
            console.print(f"signal {name!r} was sent before: nothing changed")

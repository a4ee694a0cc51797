"""Usage errors as every other ``convoq`` mistake: one ``error:`` line on stderr (naming
the usage and where help is) and exit code 2, never click's framed block nor a
traceback. And help text as a terminal shows it: the commands' help comes from their
docstrings, whose reST markup (````literal````, ``:role:`name```) is made plain text.

typer re-exports one class of the click it parses with (``BadParameter``, from the click
package or from typer's own copy of it, depending on typer's release); the usage and
click error classes are found among its bases by name, so this works with either.
"""

from __future__ import annotations

import inspect
import re
import sys
from typing import Any

import typer
from typer.core import TyperGroup

from convoq.cli._render import print_error


def _click_class(name: str) -> type[Exception]:
    """The class ``name`` of the click that typer parses with."""
    found = next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)
    assert issubclass(found, Exception)
    return found


USAGE_ERROR = _click_class("UsageError")
CLICK_ERROR = _click_class("ClickException")


def _message(error: Exception) -> str:
    format_message = getattr(error, "format_message", None)
    return str(format_message() if callable(format_message) else error)


def one_line(error: Exception) -> str:
    """A usage error as one line: what is wrong, the usage, where the help is."""
    message = _message(error).rstrip(".")
    ctx = getattr(error, "ctx", None)
    if ctx is None:
        return f"{message}. (see convoq --help)"
    usage = " ".join(ctx.get_usage().split())
    return f"{message}. {usage} (see {ctx.command_path} --help)"


class OneLineUsage(TyperGroup):
    """The ``convoq`` group: runs as click does, but reports a usage error in one line."""

    def main(  # type: ignore[override]
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            # Not standalone: errors come back here instead of being printed; an Exit
            # (typer.Exit, --help, Ctrl-C) comes back as its exit code.
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except USAGE_ERROR as error:
            print_error(one_line(error))
            sys.exit(2)
        except CLICK_ERROR as error:
            print_error(_message(error))
            sys.exit(getattr(error, "exit_code", 1))
        except typer.Abort:
            print_error("aborted")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)
_ROLE = re.compile(r":[a-z]+:`(?:~[\w.]*\.)?([^`]+)`")


def plain(text: str) -> str:
    """``text`` (a docstring) with its reST literals and roles as plain text."""
    return _ROLE.sub(r"\1", _LITERAL.sub(r"\1", text))


def plain_help(app: typer.Typer) -> None:
    """Give every command and group of ``app`` its docstring's help as plain text (the
    help given explicitly too)."""
    for command in app.registered_commands:
        command.help = plain(command.help or inspect.getdoc(command.callback) or "")
    for group in app.registered_groups:
        sub = group.typer_instance
        if sub is None:
            continue
        callback = sub.registered_callback
        if callback is not None:
            callback.help = plain(callback.help or inspect.getdoc(callback.callback) or "")
        plain_help(sub)

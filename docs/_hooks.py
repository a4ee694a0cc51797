"""The site's generated reference pages, written by mkdocs itself at build time (``hooks:``
in mkdocs.yml), from the code they describe, so they cannot drift from it:

- ``configuration.md``: every ``CONVOQ_*`` setting of :class:`convoq.settings.ConvoqSettings`
  (variable, type and bounds, default, description);
- ``cli.md``: every command of the ``convoq`` typer app, with its usage, help and options;
- ``errors.md``: the :class:`convoq.errors.ConvoqError` tree and each class's docstring.

They are pages mkdocs generates (not files in docs/); link to them as to any page
(``[settings](configuration.md#convoq_redis_url)``). The render functions are plain
functions of the code, tested in tests/docs/test_generated_pages.py.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Iterator
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)
_ROLE = re.compile(r":[a-z]+:`~?(?:[\w.]*\.)?([^`.]+)`")
_QUALIFIED = re.compile(r"\b(?:[a-z_][\w]*\.)+([A-Za-z_]\w*)")


def markdown(text: str) -> str:
    """A docstring's reST (````literal````, ``:role:`a.b.c```) as markdown code."""
    return _ROLE.sub(r"`\1`", _LITERAL.sub(r"`\1`", text))


def _cell(text: str) -> str:
    """``text`` fit for one cell of a markdown table."""
    return " ".join(markdown(text).split()).replace("|", "\\|")


# -- configuration.md ----------------------------------------------------------------------
def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type) and not isinstance(annotation, types.GenericAlias):
        return annotation.__name__
    return _QUALIFIED.sub(r"\1", str(annotation)).replace("NoneType", "None")


_BOUNDS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "length ≥"}


def _bounds(metadata: list[Any]) -> str:
    found = []
    for item in metadata:
        for attribute, sign in _BOUNDS.items():
            value = getattr(item, attribute, None)
            if value is not None:
                found.append(f"{sign} {value}")
    return ", ".join(found)


def _default(field: Any) -> str:
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is None:
        return "unset"
    return f"`{value!s}`" if not isinstance(value, str) else f'`"{value}"`'


def settings_rows() -> Iterator[tuple[str, str, str, str]]:
    """``(variable, type, default, description)`` of every ``CONVOQ_*`` setting."""
    from convoq.settings import ConvoqSettings

    prefix = str(ConvoqSettings.model_config.get("env_prefix", ""))
    for name, field in ConvoqSettings.model_fields.items():
        variable = str(field.validation_alias or f"{prefix}{name}").upper()
        kind = _type_name(field.annotation)
        bounds = _bounds(field.metadata)
        kind = f"`{kind}`" + (f" ({bounds})" if bounds else "")
        yield variable, kind, _default(field), _cell(field.description or "")


def configuration_page() -> str:
    """The markdown of ``configuration.md``."""
    from convoq import settings

    lines = [
        "# Configuration",
        "",
        "Every setting, from `convoq.settings.ConvoqSettings` (this page is generated from",
        "it). Each entry point (`Client()`, `AsyncClient()`, `RedisConversationMemory()`, the",
        "worker, the CLI) resolves a setting the same way: an explicit argument, else the",
        "`CONVOQ_*` environment variable, else the default; see",
        "[`ConvoqSettings`](reference/settings.md#convoq.settings.ConvoqSettings).",
        "",
        "| Variable | Type | Default | Description |",
        "|---|---|---|---|",
    ]
    for variable, kind, default, description in settings_rows():
        lines.append(f"| <span id='{variable.lower()}'></span>`{variable}` | {kind} |"
                     f" {default} | {description} |")  # fmt: skip
    lines += ["", "## Entries of `CONVOQ_GATEWAY_API_KEYS`", ""]
    lines += [
        "A JSON list of objects, one per API key of the HTTP gateway, with these fields",
        "([`GatewayKey`](reference/settings.md#convoq.settings.GatewayKey)):",
        "",
        "| Field | Type | Default | Description |",
        "|---|---|---|---|",
    ]
    for name, field in settings.GatewayKey.model_fields.items():
        default = "required" if field.is_required() else _default(field)
        bounds = _bounds(field.metadata)
        kind = f"`{_type_name(field.annotation)}`" + (f" ({bounds})" if bounds else "")
        lines.append(f"| `{name}` | {kind} | {default} | {_cell(field.description or '')} |")
    return "\n".join(lines) + "\n"


# -- cli.md ----------------------------------------------------------------------------------
def cli_commands() -> Iterator[tuple[str, Any, Any]]:
    """``(command path, click command, its context)`` of ``convoq`` and every command
    under it, depth first in the order they were registered."""
    import typer.main

    from convoq.cli import app

    root = typer.main.get_command(app)
    stack = [(root, root.context_class(root, info_name="convoq"))]
    while stack:
        command, ctx = stack.pop(0)
        yield ctx.command_path, command, ctx
        subcommands = getattr(command, "commands", {})
        stack[:0] = [
            (sub, sub.context_class(sub, info_name=name, parent=ctx))
            for name, sub in subcommands.items()
        ]


def _help(command: Any) -> str:
    # The docstring itself: the app's help texts were made plain text for the terminal.
    callback = getattr(command, "callback", None)
    doc = inspect.getdoc(callback) if callback is not None else None
    return markdown(doc or command.help or "")


def _options(command: Any, ctx: Any) -> list[str]:
    rows = []
    for param in command.get_params(ctx):
        if param.param_type_name == "argument" or getattr(param, "hidden", False):
            continue
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, text = record
        rows.append(f"| `{names}` | {_cell(text)} |")
    return ["| Option | Help |", "|---|---|", *rows] if rows else []


def _arguments(command: Any) -> list[str]:
    rows = []
    for param in command.params:
        if param.param_type_name == "argument":
            need = "required" if param.required else "optional"
            text = getattr(param, "help", None) or ""
            name = (param.metavar or param.name or "").upper()
            rows.append(f"| `{name}` | {need} | {_cell(text)} |")
    return ["| Argument | | Help |", "|---|---|---|", *rows] if rows else []


def cli_page() -> str:
    """The markdown of ``cli.md``."""
    lines = [
        "# Command line",
        "",
        "Every `convoq` command, its arguments and options (this page is generated from the",
        "command line's own definitions; `convoq COMMAND --help` prints the same). Options",
        "override the `CONVOQ_*` settings ([Configuration](configuration.md)).",
    ]
    for path, command, ctx in cli_commands():
        usage = " ".join([path, *command.collect_usage_pieces(ctx)])
        lines += ["", f"## `{path}`", "", "```text", usage, "```", "", _help(command), ""]
        lines += [*_arguments(command), "", *_options(command, ctx)]
    return "\n".join(lines) + "\n"


# -- errors.md -------------------------------------------------------------------------------
def error_classes() -> list[type[Exception]]:
    """Every error class of :mod:`convoq.errors`, in the order the module defines them."""
    from convoq import errors

    return [
        value
        for value in vars(errors).values()
        if isinstance(value, type)
        and issubclass(value, errors.ConvoqError)
        and value.__module__ == errors.__name__
    ]


def _first_sentence(text: str) -> str:
    paragraph = " ".join(text.split("\n\n")[0].split())
    return re.split(r"(?<=[.;:])\s", paragraph, maxsplit=1)[0].rstrip(".;:")


def _tree(root: type[Exception], classes: list[type[Exception]], indent: str = "") -> list[str]:
    children = [c for c in classes if c.__base__ is root]
    lines = []
    for index, child in enumerate(children):
        last = index == len(children) - 1
        summary = _first_sentence(markdown(inspect.getdoc(child) or ""))
        branch = "└── " if last else "├── "
        lines.append(f"{indent}{branch}{child.__name__:<{34 - len(indent)}} {summary}")
        lines += _tree(child, classes, indent + ("    " if last else "│   "))
    return lines


def errors_page() -> str:
    """The markdown of ``errors.md``."""
    from convoq.errors import ConvoqError

    classes = error_classes()
    lines = [
        "# Errors",
        "",
        "Every error convoq raises is a `ConvoqError`; catch the root or any branch. An",
        "error that crosses processes (a queued turn that failed) travels as data,",
        "`{type, message, details}`, in the turn record and is raised again by",
        "`TurnHandle.wait`. This page is generated from `convoq/errors.py`; the classes'",
        "fields and methods are in the [API reference](reference/errors.md).",
        "",
        "```text",
        ConvoqError.__name__,
        *_tree(ConvoqError, classes),
        "```",
    ]
    for cls in classes:
        parent = cls.__mro__[1].__name__
        anchor = f"reference/errors.md#convoq.errors.{cls.__name__}"
        lines += ["", f"## {cls.__name__}", "", f"Subclass of `{parent}`."]
        lines += ["", markdown(inspect.getdoc(cls) or ""), "", f"[API reference]({anchor})"]
    return "\n".join(lines) + "\n"


# -- the hook --------------------------------------------------------------------------------
PAGES: dict[str, Callable[[], str]] = {
    "configuration.md": configuration_page,
    "cli.md": cli_page,
    "errors.md": errors_page,
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated pages to the site."""
    for name, render in PAGES.items():
        if files.get_file_from_path(name) is not None:
            raise PluginError(f"docs/{name} is generated at build time: delete the file")
        files.append(File.generated(config, name, content=render()))
    return files

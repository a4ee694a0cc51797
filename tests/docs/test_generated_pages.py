"""The pages mkdocs generates at build time (docs/_hooks.py) list every setting, every
command with its options, and every error class, as the code defines them now."""

from __future__ import annotations

import inspect
import re

import pytest
import typer

from convoq import errors
from convoq.cli import app
from convoq.settings import ConvoqSettings
from tests.docs.site import DOCS, load_hooks, nav_pages

HOOKS = load_hooks()


def test_the_configuration_page_lists_every_setting_with_its_default() -> None:
    page = HOOKS.configuration_page()
    rows = {line.split("`")[1]: line for line in page.splitlines() if "<span id=" in line}
    assert set(rows) == {f"CONVOQ_{name.upper()}" for name in ConvoqSettings.model_fields}
    assert "`int` (≥ 1, ≤ 1024) | `16` |" in rows["CONVOQ_PARTITIONS"]
    assert "| unset | Redis for memory" in rows["CONVOQ_REDIS_URL"]
    assert '`"convoq"`' in rows["CONVOQ_PREFIX"]


def _commands(group: typer.Typer, path: str) -> list[tuple[str, list[str]]]:
    """``(command path, its option names)`` from the typer app's registrations, apart
    from how the page walks the click commands."""
    found = []
    for command in group.registered_commands:
        name = command.name or command.callback.__name__.replace("_", "-")  # type: ignore[union-attr]
        parameters = inspect.signature(command.callback).parameters.values()  # type: ignore[arg-type]
        options = [p.name for p in parameters if isinstance(p.default, typer.models.OptionInfo)]
        found.append((f"{path} {name}", options))
    for sub in group.registered_groups:
        assert sub.typer_instance is not None and sub.name
        found += [(f"{path} {sub.name}", []), *_commands(sub.typer_instance, f"{path} {sub.name}")]
    return found


def test_the_cli_page_has_every_command_and_its_options() -> None:
    page = HOOKS.cli_page()
    sections = {s.split("`", 1)[0]: s for s in page.split("\n## `")[1:]}
    commands = _commands(app, "convoq")
    assert len(commands) >= 15
    assert set(sections) == {"convoq"} | {path for path, _ in commands}
    for path, options in commands:
        for option in options:
            # an option may be named otherwise on the command line; its flag is its name
            # unless given, so look for either in the section's table
            assert f"--{option.replace('_', '-')}" in sections[path] or option in sections[path]


def test_the_cli_page_renders_docstring_literals_as_code() -> None:
    assert HOOKS.markdown("run ``convoq worker`` (:class:`~convoq.client.Client`)") == (
        "run `convoq worker` (`Client`)"
    )
    assert "`convoq redis stop`" in HOOKS.cli_page()
    assert not re.search(r"``[^`\n]+``", HOOKS.cli_page())


def test_the_errors_page_has_the_whole_tree_and_every_docstring() -> None:
    page = HOOKS.errors_page()
    classes = [
        c for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, errors.ConvoqError)
    ]  # fmt: skip
    assert len(classes) >= 30
    tree = page.split("```text\n", 1)[1].split("```", 1)[0]
    for cls in classes:
        assert f"\n## {cls.__name__}\n" in page
        assert HOOKS.markdown(inspect.getdoc(cls) or "") in page
        assert f"── {cls.__name__} " in tree or cls is errors.ConvoqError
    assert "│   ├── ModelHTTPError" in tree  # a branch under its parent


@pytest.mark.parametrize("page", sorted(HOOKS.PAGES))
def test_the_generated_pages_are_in_the_nav_and_not_files(page: str) -> None:
    assert page in set(nav_pages())
    assert not (DOCS / page).exists()  # generated at build time: a file would go stale

"""``--help`` shows the commands' docstrings as plain text: no reST literals (double
backticks) nor roles reach the terminal."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from convoq.cli import app

COMMANDS = [
    [],
    ["worker"], ["gateway"], ["flower"], ["demo"], ["submit"], ["watch"], ["status"],
    ["workers"], ["history"], ["approve"], ["deny"], ["cancel"], ["clear"], ["export"],
    ["import"], ["redis"], ["redis", "stop"], ["complete-call"], ["signal"],
]  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "convoq")
def test_help_has_no_rest_markup(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "``" not in result.output and ":class:`" not in result.output, result.output


def test_a_literal_in_a_docstring_shows_as_its_text() -> None:
    result = CliRunner().invoke(app, ["import", "--help"], env={"COLUMNS": "200"})
    assert "exported with convoq export." in result.output

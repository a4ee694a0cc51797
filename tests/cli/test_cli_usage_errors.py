"""A mistake on the command line (click's own usage errors and the option values ``convoq``
checks before it connects) exits 2 with one ``error:`` line, as the docs' workers page
says: no framed block, no traceback, nothing connected to."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from convoq._ports import free_loopback_port
from convoq.cli import app

CONVOQ = str(Path(sys.executable).with_name("convoq"))

MISTAKES: list[tuple[list[str], str]] = [
    (["submit"], "Missing argument"),
    (["nosuch"], "No such command"),
    (["submit", "c1", "hi", "--bogus"], "No such option"),
    (["history", "c1", "--last", "many"], "Invalid value for '--last'"),
    (["status", "c1"], "CONVERSATION_ID TURN_ID"),
    (["redis", "stop", "--bogus"], "No such option"),
    (["submit", "c1", "hi", "--metadata", "{nope"], "--metadata must be JSON"),
    (["submit", "c1", "hi", "--metadata", "[1]"], "JSON object"),
    (["submit", "c1", "hi", "--model-settings", "[1]"], "--model-settings must be a JSON"),
    (["submit", "c1", "hi", "--output-schema", "{nope"], "--output-schema is not JSON"),
    (["submit", "c1", "hi", "--image", "/nope.png"], "no file at"),
    (["worker", "--partitions", "99"], "partitions 99 do not exist"),
    (["submit", "c1", "hi", "--if-busy", "later"], "--if-busy must be one of queue, reject"),
]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """No Redis behind the URL: a mistake must be reported before any connection."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONVOQ_")}
    return {
        **clean,
        "CONVOQ_REDIS_URL": f"redis://127.0.0.1:{free_loopback_port()}/0",
        "CONVOQ_HOME": str(tmp_path / "home"),
        "COLUMNS": "100",
    }


def _wrong(code: int, stdout: str, stderr: str, says: str) -> list[str]:
    lines = [line for line in stderr.splitlines() if line.strip()]
    wrong = [
        code != 2 and f"exit code {code}",
        "Traceback" in stdout + stderr and "a traceback",
        len(lines) != 1 and f"{len(lines)} lines on stderr",
        bool(lines) and not lines[0].startswith("error: ") and "no 'error:' line",
        says not in stderr and f"does not say {says!r}",
        stdout.strip() != "" and f"stdout: {stdout!r}",
    ]
    return [w for w in wrong if w]


@pytest.mark.parametrize(("args", "says"), MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_a_usage_mistake_is_one_error_line_and_exit_code_2(
    env: dict[str, str], args: list[str], says: str
) -> None:
    result = CliRunner().invoke(app, args, env=env)
    escaped = result.exception is not None and not isinstance(result.exception, SystemExit)
    problems = _wrong(result.exit_code, result.stdout, result.stderr, says)
    assert not problems and not escaped, (problems, result.exception, result.stderr)


def test_the_installed_command_says_the_usage_in_its_one_line(
    env: dict[str, str], tmp_path: Path
) -> None:
    done = subprocess.run(
        [CONVOQ, "submit", "c1"], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert not _wrong(done.returncode, done.stdout, done.stderr, "Missing argument 'text'")
    assert "Usage: convoq submit" in done.stderr and "convoq submit --help" in done.stderr


def test_help_still_prints_in_full_and_exits_0(env: dict[str, str]) -> None:
    result = CliRunner().invoke(app, ["submit", "--help"], env=env)
    assert result.exit_code == 0 and "--metadata" in result.stdout

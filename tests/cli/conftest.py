"""The CLI tests' shared fixture: ``run`` invokes the ``convoq`` app in the environment
of the test module's worker pool (each module defines ``pool = module_pool(...)``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from typer.testing import CliRunner

from convoq.cli import app
from tests.support.workers import WorkerPool


@pytest.fixture
def run(pool: WorkerPool) -> Callable[..., str]:
    """``run(*args, code=0)``: the command's output (stdout, then stderr), after checking
    it exited with ``code``."""
    runner = CliRunner()

    def invoke(*args: str, code: int = 0) -> str:
        result = runner.invoke(app, list(args), env=pool.env)
        output = result.output + (result.stderr if result.stderr_bytes is not None else "")
        assert result.exit_code == code, output
        return output

    return invoke

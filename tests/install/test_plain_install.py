"""``pip install convoq`` without extras can run a worker and a turn: every module the
worker and the client import (kombu's Redis transport included) is a declared dependency.

Slow (it builds the package and installs it with its dependencies into a fresh venv), and
bounded by its timeout.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.fresh_install import install, run_a_turn


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_plain_install_runs_a_turn_through_a_worker(redis_url: str, tmp_path: Path) -> None:
    python = install(tmp_path)
    answer = run_a_turn(python, redis_url, tmp_path)
    assert "Ada" in answer and "image intact" in answer
    # The demo runs too, without the gateway's web stack: it says what that part needs.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONVOQ_", "PYTHON"))}
    demo = subprocess.run(
        [str(python.parent / "convoq"), "demo"], env=env, cwd=tmp_path, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    shown = demo.stdout + demo.stderr
    assert demo.returncode == 0 and "Traceback" not in shown, shown[-3000:]
    assert "pip install 'convoq[gateway]'" in shown and "demo finished" in shown

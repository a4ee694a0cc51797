"""``pip install convoq`` without extras can run a worker and a turn: every module the
worker and the client import (kombu's Redis transport included) is a declared dependency.

Slow (it builds the package and installs it with its dependencies into a fresh venv), and
bounded by its timeout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests" / "support" / "plain_install_turn.py"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_plain_install_runs_a_turn_through_a_worker(redis_url: str, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=780,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONVOQ_", "PYTHON"))}
    env.update(
        CONVOQ_REDIS_URL=redis_url,
        CONVOQ_PREFIX=f"plain{uuid.uuid4().hex[:8]}",
        CONVOQ_HOME=str(tmp_path / "home"),
        CONVOQ_AGENTS="convoq.cli.demo_agents",
    )
    (tmp_path / "home").mkdir()
    # Run a copy from tmp_path so neither the source tree nor tests/support (whose module
    # names could shadow installed packages on sys.path[0]) is importable: only the
    # installed package is.
    driver = tmp_path / DRIVER.name
    shutil.copyfile(DRIVER, driver)
    turn = subprocess.run(
        [str(python), str(driver)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    log = tmp_path / "home" / "worker.log"
    detail = turn.stderr[-3000:] + (log.read_text()[-3000:] if log.exists() else "")
    assert turn.returncode == 0, detail
    assert "Ada" in turn.stdout, detail

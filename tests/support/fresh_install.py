"""convoq installed into a fresh venv, and a turn run through a worker of that venv: what
the install tests share (the defaults; the declared floor versions).

The venv holds only what pip installs for ``pip install convoq`` plus the pins given; the
driver (:mod:`tests.support.plain_install_turn`) runs from a copy outside the source tree
so that only the installed package is importable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "support" / "plain_install_turn.py"


def declared_floors() -> list[str]:
    """``name==floor`` for every dependency of pyproject.toml (each declares a floor)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins: list[str] = []
    for line in project["dependencies"]:
        requirement = Requirement(line)
        (floor,) = [s.version for s in requirement.specifier if s.operator == ">="]
        pins.append(f"{requirement.name}=={floor}")
    return pins


def _pip(python: Path, *args: str) -> list[str]:
    """This suite's pip acting on the venv of ``python`` (``pip --python``): the venv needs
    no pip of its own, so it holds only what ``pip install convoq`` puts there, and making
    it skips bootstrapping one (4 of the 19 s a venv and an install took)."""
    return [sys.executable, "-m", "pip", "--python", str(python), *args]


def install(tmp_path: Path, *pins: str) -> Path:
    """A fresh venv with convoq from this tree (and ``pins`` beside it): its python."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    # Wheels over source builds: pip's cache then serves a rerun without building anything.
    # No byte-compiling of every installed module (about 6 s): the turn compiles the few
    # it imports.
    command = _pip(python, "install", "-q", "--disable-pip-version-check", "--no-compile")
    command += ["--prefer-binary", str(ROOT), *pins]
    done = subprocess.run(command, capture_output=True, text=True, timeout=780)
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def installed_versions(python: Path) -> dict[str, str]:
    """``{normalised name: version}`` of what the venv of ``python`` holds."""
    listed = subprocess.run(
        _pip(python, "list", "--format=freeze", "--disable-pip-version-check"),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    pairs = (line.split("==") for line in listed.splitlines() if "==" in line)
    return {name.lower().replace("_", "-"): version for name, version in pairs}


def run_a_turn(python: Path, redis_url: str, tmp_path: Path) -> str:
    """Start a worker of the venv, send it one turn of the demo agents (with an image);
    what the driver printed: the answer, then whether the image came back intact."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONVOQ_", "PYTHON"))}
    env.update(
        CONVOQ_REDIS_URL=redis_url,
        CONVOQ_PREFIX=f"plain{uuid.uuid4().hex[:8]}",
        CONVOQ_HOME=str(home),
        CONVOQ_AGENTS="convoq.cli.demo_agents",
    )
    driver = tmp_path / DRIVER.name
    shutil.copyfile(DRIVER, driver)
    turn = subprocess.run(
        [str(python), str(driver)], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    log = home / "worker.log"
    detail = turn.stderr[-3000:] + (log.read_text()[-3000:] if log.exists() else "")
    assert turn.returncode == 0, detail
    return turn.stdout

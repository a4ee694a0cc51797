"""Each framework integration is an optional extra: the core never imports a framework,
and importing an integration without its framework says which extra to install.

The framework is hidden from a fresh interpreter by a meta-path finder that refuses it,
as if it were not installed."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from convoq.integrations import MissingExtraError, missing_extra

ROOT = Path(__file__).resolve().parents[2]

HIDE = """
import importlib.abc, sys
HIDDEN = {hidden!r}
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Hide())
"""

IMPORT_INTEGRATION = """
import json
from convoq.errors import ConfigurationError
try:
    import {module}
except ImportError as exc:
    print(json.dumps({{"type": type(exc).__name__, "message": str(exc),
                       "convoq": isinstance(exc, ConfigurationError),
                       "extra": exc.details["extra"]}}))
else:
    print(json.dumps(None))
"""

CORE = """
import json, sys
import convoq, convoq.memory, convoq.memory.redis, convoq.client, convoq.worker.app
import convoq.cli, convoq.gateway
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in
                        ("agents", "langchain_core", "convoq") and
                        (not m.startswith("convoq") or m.startswith("convoq.integrations")))))
"""


def run_python(code: str) -> object:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("module", "framework", "extra"),
    [
        ("convoq.integrations.openai_agents", "agents", "openai-agents"),
        ("convoq.integrations.langchain", "langchain_core", "langchain"),
    ],
)
def test_an_integration_without_its_framework_names_the_extra(
    module: str, framework: str, extra: str
) -> None:
    found = run_python(HIDE.format(hidden={framework}) + IMPORT_INTEGRATION.format(module=module))
    assert found == {
        "type": "MissingExtraError",
        "message": f"{module} needs the {framework!r} package, which convoq's {extra!r} extra"
        f" installs: pip install 'convoq[{extra}]'",
        "convoq": True,
        "extra": extra,
    }


def test_with_the_framework_installed_the_integration_imports() -> None:
    code = IMPORT_INTEGRATION.format(module="convoq.integrations.openai_agents")
    assert run_python(code) is None


def test_the_core_imports_no_framework_and_no_integration() -> None:
    assert run_python(CORE) == []


def test_the_core_install_does_not_pull_a_framework_in() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"]).lower()
    assert "openai-agents" not in core and "langchain" not in core
    extras = project["optional-dependencies"]
    assert any(d.startswith("openai-agents") for d in extras["openai-agents"])
    assert any(d.startswith("langchain-core") for d in extras["langchain"])


def test_the_missing_extra_error_pickles_with_its_fields() -> None:
    err = missing_extra("agents", extra="openai-agents", integration="x")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is MissingExtraError and isinstance(back, ImportError)
    assert str(back) == str(err) and back.details == {"extra": "openai-agents", "missing": "agents"}

"""Every module of the package sits on a layer of the import-linter contract, so no new
module escapes the layering rule that ``make lint`` checks."""

from __future__ import annotations

import pkgutil
import re
import tomllib
from pathlib import Path

import convoq

ROOT = Path(__file__).resolve().parents[1]


def layered_modules() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    [layers] = [c["layers"] for c in contracts if c["type"] == "layers"]
    return {name.strip() for layer in layers for name in re.split(r"[|:]", layer)}


def test_every_module_of_the_package_is_on_a_layer() -> None:
    modules = {f"convoq.{info.name}" for info in pkgutil.iter_modules(convoq.__path__)}
    missing = sorted(modules - layered_modules())
    assert not missing, f"add {missing} to a layer of [tool.importlinter] in pyproject.toml"

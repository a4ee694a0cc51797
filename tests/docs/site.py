"""The documentation site as the tests see it: the public modules and their reference
pages, the nav of mkdocs.yml, the generating hooks, and a built site's HTML."""

from __future__ import annotations

import importlib.util
import os
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

import convoq

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"


def public_modules() -> list[str]:
    """Every module of convoq a user may import: no part of its name starts with ``_``."""
    found = [
        info.name
        for info in pkgutil.walk_packages(convoq.__path__, "convoq.")
        if not any(part.startswith("_") for part in info.name.split("."))
    ]
    return ["convoq", *sorted(found)]


def reference_page(module: str) -> str:
    """The page documenting ``module``, under docs/: ``convoq`` is reference/convoq.md,
    ``convoq.a.b`` is reference/a/b.md."""
    parts = module.split(".")[1:] or ["convoq"]
    return "reference/" + "/".join(parts) + ".md"


def nav_pages(nav: Any = None) -> Iterator[str]:
    """Every page named in the nav of mkdocs.yml."""
    if nav is None:
        nav = yaml.safe_load(MKDOCS_YML.read_text("utf-8"))["nav"]
    for entry in nav if isinstance(nav, list) else [nav]:
        if isinstance(entry, str):
            yield entry
        elif isinstance(entry, dict):
            for value in entry.values():
                yield from nav_pages(value)


def load_hooks() -> ModuleType:
    """docs/_hooks.py, the module mkdocs loads by path (it is in no package)."""
    spec = importlib.util.spec_from_file_location("convoq_docs_hooks", DOCS / "_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` (as ``make docs``) into ``site``."""
    mkdocs = Path(sys.executable).with_name("mkdocs")
    return subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


class PageLinks(HTMLParser):
    """The ids of one HTML page and every URL it refers to (``href``, ``src``), with the
    tag and ``rel`` each one came from."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.urls: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        for name in ("id", "name"):
            if name in values and (name == "id" or tag == "a"):
                self.ids.add(values[name])
        for name in ("href", "src"):
            if values.get(name):
                self.urls.append((tag, values.get("rel", ""), values[name]))


def read_page(path: Path) -> PageLinks:
    """The links and ids of one built HTML page."""
    parser = PageLinks()
    parser.feed(path.read_text("utf-8"))
    return parser

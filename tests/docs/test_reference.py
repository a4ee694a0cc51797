"""Every public module of convoq (importable, no part of its name starting with ``_``) has
an API reference page generated from its docstrings, and the nav lists it: a new module
cannot be left out of the reference."""

from __future__ import annotations

import importlib

import pytest

from tests.docs.site import DOCS, nav_pages, public_modules, reference_page

MODULES = public_modules()


def test_the_public_modules_are_found_public_and_private_apart() -> None:
    assert {"convoq", "convoq.mcp", "convoq.gateway", "convoq.testing"} <= set(MODULES)
    assert {"convoq.integrations.langchain", "convoq.integrations.pydantic_ai"} <= set(MODULES)
    assert not any("._" in name for name in MODULES)
    assert reference_page("convoq") == "reference/convoq.md"
    assert reference_page("convoq.integrations.langchain") == "reference/integrations/langchain.md"


@pytest.mark.parametrize("module", MODULES)
def test_a_public_module_has_its_reference_page(module: str) -> None:
    importlib.import_module(module)  # public means importable too
    page = DOCS / reference_page(module)
    assert page.is_file(), f"{module} has no reference page: write docs/{reference_page(module)}"
    assert f"::: {module}\n" in page.read_text("utf-8"), f"{page} does not render {module}"
    assert reference_page(module) in set(nav_pages()), f"mkdocs.yml's nav lacks {page.name}"


def test_every_reference_page_documents_a_public_module() -> None:
    pages = {p.relative_to(DOCS).as_posix() for p in (DOCS / "reference").rglob("*.md")}
    assert pages == {reference_page(m) for m in MODULES}

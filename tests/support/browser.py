"""A headless chromium driven by Playwright, as pytest fixtures: ``browser`` for the
module, ``page`` per test (import ``browser_fixture, page_fixture`` to use them). Debian's
``chromium`` is used (Playwright downloads nothing); where it or Playwright is missing the
tests skip and say how to install it (under CI=true they fail: see tests.support.services)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import services

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module", name="browser")
def browser_fixture() -> Iterator[Any]:
    executable = services.chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        services.missing("Playwright is not installed: pip install -e '.[dev]'")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(name="page")
def page_fixture(browser: Any) -> Iterator[Any]:
    context = browser.new_context()
    opened = context.new_page()
    opened.set_default_timeout(30_000)
    yield opened
    context.close()

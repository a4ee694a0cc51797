"""Fixtures of the documentation tests: the offline model every block's ``openai(...)``
model reaches."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.docs.examples import OfflineModelServer


@pytest.fixture(scope="session")
def model_server() -> Iterator[OfflineModelServer]:
    server = OfflineModelServer()
    with server:
        yield server

"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from convoq.memory import ConversationMemory
from tests.support.memory_backends import backend_url, close_memory, make_memory


@pytest.fixture(params=["in_memory", "file", "redis", "redis-cluster"])
def memory(
    request: pytest.FixtureRequest, tmp_path: Path, key_prefix: str
) -> Iterator[ConversationMemory]:
    """A fresh memory of each backend: in process, files, a redis-server, a Redis Cluster."""
    made = make_memory(request.param, tmp_path, backend_url(request, request.param), key_prefix)
    yield made
    close_memory(made)

"""Memory backends by name, so every memory test body runs on each of them."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest

from convoq._sync import run_sync
from convoq.memory import ConversationMemory, FileConversationMemory, InMemoryConversationMemory

BACKENDS = ["in_memory", "file", "redis", "redis-cluster"]


def _in_memory(tmp_path: Path, redis_url: str | None, key_prefix: str) -> ConversationMemory:
    return InMemoryConversationMemory()


def _file(tmp_path: Path, redis_url: str | None, key_prefix: str) -> ConversationMemory:
    return FileConversationMemory(tmp_path / "conversations")


def _redis(tmp_path: Path, redis_url: str | None, key_prefix: str) -> ConversationMemory:
    module = pytest.importorskip("convoq.memory.redis")
    memory: ConversationMemory = module.RedisConversationMemory(url=redis_url, prefix=key_prefix)
    return memory


def _redis_cluster(tmp_path: Path, redis_url: str | None, key_prefix: str) -> ConversationMemory:
    if not (redis_url or "").startswith("redis+cluster://"):
        # Anything else would quietly test one server (or the embedded one) twice.
        raise ValueError(f"the redis-cluster backend needs a cluster URL, not {redis_url!r}")
    return _redis(tmp_path, redis_url, key_prefix)


_FACTORIES: dict[str, Callable[[Path, str | None, str], ConversationMemory]] = {
    "in_memory": _in_memory,
    "file": _file,
    "redis": _redis,
    "redis-cluster": _redis_cluster,
}


def backend_url(request: pytest.FixtureRequest, name: str) -> str | None:
    """The URL backend ``name`` needs, starting (or reusing) only its session server."""
    if name == "redis":
        return str(request.getfixturevalue("redis_server").url)
    if name == "redis-cluster":
        return str(request.getfixturevalue("redis_cluster").url)
    return None


def make_memory(
    name: str, tmp_path: Path, redis_url: str | None, key_prefix: str
) -> ConversationMemory:
    """A fresh, empty memory of backend ``name`` (``redis_url`` only matters for redis)."""
    return _FACTORIES[name](tmp_path, redis_url, key_prefix)


def close_memory(memory: ConversationMemory) -> None:
    """Release what a backend holds (connection pools), whether its close is sync or async."""
    for name in ("close", "aclose"):
        closer = getattr(memory, name, None)
        if callable(closer):
            result = closer()
            if inspect.isawaitable(result):
                run_sync(_await(result))
            return


async def _await(awaitable: object) -> None:
    await awaitable  # type: ignore[misc]

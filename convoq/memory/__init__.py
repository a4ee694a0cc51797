"""Conversation memory: the protocol and convoq's backends.

``RedisConversationMemory`` is imported on first use, so ``import convoq.memory`` does not
import redis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from convoq.memory.adapt import MemoryLike, as_memory
from convoq.memory.base import ConversationMemory, StoredConversationMemory
from convoq.memory.file import FileConversationMemory
from convoq.memory.in_memory import InMemoryConversationMemory

if TYPE_CHECKING:
    from convoq.memory.redis import RedisConversationMemory

__all__ = [
    "ConversationMemory",
    "FileConversationMemory",
    "InMemoryConversationMemory",
    "MemoryLike",
    "RedisConversationMemory",
    "StoredConversationMemory",
    "as_memory",
]


def __getattr__(name: str) -> Any:
    if name == "RedisConversationMemory":
        from convoq.memory.redis import RedisConversationMemory

        return RedisConversationMemory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

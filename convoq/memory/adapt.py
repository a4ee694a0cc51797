"""Any object with the memory guide's three methods, used as a :class:`ConversationMemory`.

The guide (and Rig's ``ConversationMemory`` trait) shapes a store as ``load(conversation_id)``,
``append(conversation_id, messages)`` and ``clear(conversation_id)``; each may be a plain
or an ``async`` method. Such an object need not derive from :class:`ConversationMemory`:
:func:`as_memory` wraps it, running plain methods on the pool for blocking user code so a
slow store never holds up the event loop. A memory that is already a
:class:`ConversationMemory` is used as it is.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Protocol, runtime_checkable

from convoq._sync import call_maybe_async
from convoq.errors import ConfigurationError, ConversationMemoryError
from convoq.memory.base import ConversationMemory
from convoq.messages import Message

_METHODS = ("load", "append", "clear")
# One wrapper per user object (by id, while some agent holds the wrapper, which keeps the
# object and so its id alive), so agents sharing it also share its reservations.
_WRAPPED: weakref.WeakValueDictionary[int, ConversationMemory] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


@runtime_checkable
class MemoryLike(Protocol):
    """The guide's interface: each method plain or ``async``."""

    def load(self, conversation_id: str) -> Any: ...

    def append(self, conversation_id: str, messages: list[Message]) -> Any: ...

    def clear(self, conversation_id: str) -> Any: ...


class _Wrapped(ConversationMemory):
    """A user object's three methods behind the ConversationMemory API."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def aload(self, conversation_id: str) -> list[Message]:
        loaded = await call_maybe_async(self.inner.load, conversation_id)
        if loaded is None:
            return []
        messages = list(loaded)
        if not all(isinstance(m, Message) for m in messages):
            raise ConversationMemoryError(
                f"{type(self.inner).__name__}.load must return a list of Message",
                conversation_id=conversation_id,
            )
        return messages

    async def aappend(self, conversation_id: str, messages: list[Message]) -> None:
        await call_maybe_async(self.inner.append, conversation_id, list(messages))

    async def aclear(self, conversation_id: str) -> None:
        await call_maybe_async(self.inner.clear, conversation_id)


def as_memory(memory: ConversationMemory | MemoryLike | Any) -> ConversationMemory:
    """``memory`` as a :class:`ConversationMemory` (the same object if it is one).

    Raises:
        ConfigurationError: ``memory`` lacks one of ``load``, ``append``, ``clear``.
    """
    if isinstance(memory, ConversationMemory):
        return memory
    missing = [name for name in _METHODS if not callable(getattr(memory, name, None))]
    if missing:
        raise ConfigurationError(
            f"a memory needs load, append and clear methods; {type(memory).__name__} lacks"
            f" {', '.join(missing)}"
        )
    with _LOCK:
        found = _WRAPPED.get(id(memory))
        if found is None or getattr(found, "inner", None) is not memory:
            found = _Wrapped(memory)
            _WRAPPED[id(memory)] = found
        return found

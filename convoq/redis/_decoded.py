"""Decoded turns kept in process: a stored element is decoded once, then shared.

A stored turn never changes (appends add elements, prune and clear remove them), so the
messages one element decodes to are the same for every read of it. :class:`DecodedTurns`
keeps them by the element's bytes (and the conversation they belong to), least recently
used first out once the estimated size passes its bound. A read still fetches the
elements from Redis (that is how it knows what the history holds now) and decodes only
those it has not seen; the messages it hands out are :func:`~convoq.messages.shared_message`
values, read-only, the same objects for every reader.

Keyed by content, an entry can never be stale: a conversation cleared and written again
has other elements (or the same bytes, which decode the same). Prune, clear, delete,
import, pop and a new summary still drop the conversation's entries (:meth:`forget`), so
what this process no longer needs (or must no longer hold: a deleted conversation) goes
at once; another process's delete is not seen here, and its entries leave by age.

Beside speed, sharing spares the garbage collector: a load of 10,000 turns makes some
100,000 tracked objects when it decodes (five a message of one text part), none when it
finds them here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from convoq.messages import Message

# Per decoded message, what its objects take beyond its text (measured with tracemalloc:
# 1,600-1,800 bytes for a message of one text part), and per byte of the element.
_PER_MESSAGE = 1_700
_PER_BYTE = 2

Turn = tuple[Message, ...]


def estimated_size(element: bytes, messages: Sequence[Message], blob_bytes: int = 0) -> int:
    """What an entry is counted as against the bound (bytes, an estimate)."""
    return _PER_BYTE * len(element) + _PER_MESSAGE * len(messages) + blob_bytes + 100


class DecodedTurns:
    """Shared decoded elements under a size bound (``max_bytes``; 0 keeps nothing).
    Thread-safe: sync and async readers of a store share it."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, bytes], tuple[Turn, int]] = OrderedDict()
        self._owned: dict[str, set[bytes]] = {}
        self._size = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def size(self) -> int:
        """The estimated bytes held now."""
        return self._size

    def __len__(self) -> int:
        return len(self._entries)

    def held(self, owner: str) -> int:
        """How many elements of conversation ``owner`` are kept."""
        with self._lock:
            return len(self._owned.get(owner, ()))

    def lookup(self, owner: str, elements: Sequence[bytes]) -> list[Turn | None]:
        """The decoded messages of each element of conversation ``owner`` (its keys'
        common base), None for those not held."""
        found: list[Turn | None] = []
        entries = self._entries
        with self._lock:
            for element in elements:
                entry = entries.get((owner, element))
                if entry is None:
                    found.append(None)
                    continue
                entries.move_to_end((owner, element))
                found.append(entry[0])
            hits = sum(1 for turn in found if turn is not None)
            self.hits += hits
            self.misses += len(found) - hits
        return found

    def store(self, owner: str, element: bytes, messages: Turn, blob_bytes: int = 0) -> None:
        """Keep ``messages`` (already shared) as what ``element`` decodes to."""
        self.store_many(owner, [(element, messages, blob_bytes)])

    def store_many(self, owner: str, decoded: Sequence[tuple[bytes, Turn, int]]) -> None:
        """:meth:`store` of several ``(element, messages, blob bytes)``, in one hold of
        the lock."""
        with self._lock:
            owned = self._owned.setdefault(owner, set())
            for element, messages, blob_bytes in decoded:
                size = estimated_size(element, messages, blob_bytes)
                key = (owner, element)
                if size > self.max_bytes or key in self._entries:
                    continue
                self._entries[key] = (messages, size)
                owned.add(element)
                self._size += size
            if not owned:
                del self._owned[owner]
            while self._size > self.max_bytes:
                (old_owner, old_element), (_, old_size) = self._entries.popitem(last=False)
                self._size -= old_size
                self._disown(old_owner, old_element)

    def forget(self, owner: str) -> None:
        """Drop every entry of conversation ``owner``."""
        with self._lock:
            for element in self._owned.pop(owner, ()):
                _, size = self._entries.pop((owner, element))
                self._size -= size

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._owned.clear()
            self._size = 0

    def _disown(self, owner: str, element: bytes) -> None:
        owned = self._owned.get(owner)
        if owned is not None:
            owned.discard(element)
            if not owned:
                del self._owned[owner]


_cache: DecodedTurns | None = None
_resolved = False
_resolving = threading.Lock()


def process_cache() -> DecodedTurns | None:
    """This process's decoded turns, sized by ``CONVOQ_DECODED_CACHE_BYTES`` (read once,
    at the first decode; every store of the process shares it), or None when that is 0:
    then nothing is kept and each read decodes what it reads into messages of its own."""
    if not _resolved:
        _resolve()
    return _cache


def forget(owner: str) -> None:
    """Drop what the process keeps of conversation ``owner`` (see :meth:`DecodedTurns.forget`)."""
    if _cache is not None:
        _cache.forget(owner)


def reset() -> None:
    """Drop the cache and read the setting again at the next decode (tests, benchmarks)."""
    global _cache, _resolved
    with _resolving:
        _cache, _resolved = None, False


def _resolve() -> None:
    global _cache, _resolved
    from convoq.settings import ConvoqSettings

    with _resolving:
        if not _resolved:
            size = ConvoqSettings.resolve().decoded_cache_bytes
            _cache = DecodedTurns(size) if size > 0 else None
            _resolved = True

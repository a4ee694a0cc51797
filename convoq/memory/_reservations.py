"""In-process reservations of conversations, and spent continuation tokens kept by time.

A reservation says which turn (by its token) may write a conversation through one memory
object. A running turn holds it until it ends; a turn awaiting approval holds it until
its approval ttl passes, so a dropped response cannot keep a conversation for ever.
Spent tokens are remembered only until their continuation expires: the record is bounded
by the approvals of one ttl, not by the age of the process.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


def now_ms() -> int:
    """Wall-clock unix ms: continuations carry their expiry to other processes."""
    return time.time_ns() // 1_000_000


@dataclass
class _Hold:
    token: str
    parked_until: float | None = None  # monotonic deadline while awaiting approval

    def live(self) -> bool:
        return self.parked_until is None or time.monotonic() < self.parked_until


class Reservations:
    """Which turn holds each conversation, in this process; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holds: dict[str, _Hold] = {}

    def take(self, cid: str, token: str) -> str | None:
        """Reserve ``cid`` for ``token``: None when done, else the token of the live turn
        holding it, prefixed ``"parked:"`` when that turn awaits approval."""
        with self._lock:
            hold = self._holds.get(cid)
            if hold is not None and hold.token != token and hold.live():
                return ("parked:" if hold.parked_until is not None else "") + hold.token
            self._holds[cid] = _Hold(token)
            return None

    def park(self, cid: str, token: str, ttl_s: float) -> None:
        """Keep ``cid`` reserved for ``token`` for at most ``ttl_s`` more seconds."""
        with self._lock:
            hold = self._holds.get(cid)
            if hold is not None and hold.token == token:
                hold.parked_until = time.monotonic() + ttl_s

    def free(self, cid: str, token: str) -> None:
        """Free ``cid`` if ``token`` holds it (a no-op otherwise)."""
        with self._lock:
            hold = self._holds.get(cid)
            if hold is not None and hold.token == token:
                del self._holds[cid]

    def free_parked(self, cid: str, token: str | None = None) -> tuple[str, float] | None:
        """Free ``cid`` if its holder (``token``, or any) awaits approval: clear drops
        such a turn, and one resumed or discarded elsewhere holds nothing any more.
        Returns the freed turn's token and the seconds its approval had left."""
        with self._lock:
            hold = self._holds.get(cid)
            if hold is None or hold.parked_until is None or token not in (None, hold.token):
                return None
            del self._holds[cid]
            return hold.token, max(hold.parked_until - time.monotonic(), 0.0)

    def holders(self) -> dict[str, str]:
        """Live reservations: conversation id -> token (expired ones are dropped)."""
        with self._lock:
            for cid in [c for c, h in self._holds.items() if not h.live()]:
                del self._holds[cid]
            return {cid: hold.token for cid, hold in self._holds.items()}


class SpentTokens:
    """Tokens of continuations already resumed or discarded, each until it expires."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, int] = {}  # token -> unix ms after which it cannot run anyway

    def spend(self, token: str, until_ms: int) -> bool:
        """Record ``token`` as spent; False if it already was."""
        with self._lock:
            self._prune()
            if token in self._until:
                return False
            self._until[token] = until_ms
            return True

    def __contains__(self, token: object) -> bool:
        with self._lock:
            until = self._until.get(token) if isinstance(token, str) else None
            return until is not None and until > now_ms()

    def __len__(self) -> int:
        with self._lock:
            self._prune()
            return len(self._until)

    def _prune(self) -> None:
        now = now_ms()
        for old in [t for t, until in self._until.items() if until <= now]:
            del self._until[old]

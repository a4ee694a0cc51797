"""Redis: conversation history and the turn protocol (Lua scripts), plus the embedded server.

- :mod:`convoq.redis.keys`: every key name (``KeySchema``).
- :mod:`convoq.redis.protocol`: ``TurnProtocol``, a typed async function per script.
- :mod:`convoq.redis.embedded`: a private redis-server under ``.convoq/`` when no URL is set.

The Redis layout has ``format_version`` 2 (see :mod:`convoq.redis._codec`); scripts run on
Redis 6.2 and later.
"""

from convoq.redis._base import connect
from convoq.redis.keys import KeySchema
from convoq.redis.protocol import (
    Acquired,
    SubmitResult,
    TurnEnding,
    TurnProtocol,
    TurnRecord,
    TurnStatus,
)

__all__ = [
    "Acquired",
    "KeySchema",
    "SubmitResult",
    "TurnEnding",
    "TurnProtocol",
    "TurnRecord",
    "TurnStatus",
    "connect",
]

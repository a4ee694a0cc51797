"""Small steps the turn-protocol tests share: a protocol on its own client, queued turns,
and whole turns to commit."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from convoq.messages import Message
from convoq.redis import TurnProtocol


@contextlib.asynccontextmanager
async def open_protocol(url: str, prefix: str, **limits: Any) -> AsyncIterator[TurnProtocol]:
    """``TurnProtocol.from_url``, closed on the way out."""
    protocol = TurnProtocol.from_url(url, prefix=prefix, **limits)
    try:
        yield protocol
    finally:
        await protocol.close()


async def submit_all(proto: TurnProtocol, cid: str, *turn_ids: str) -> None:
    """Queue one turn per id, in order; each user message says its turn id."""
    for tid in turn_ids:
        await proto.submit(cid, tid, agent="bot", message=Message.user(tid), options={})


def exchange(said: str, reply: str = "ok") -> list[Message]:
    """A whole turn to commit: the user's message and the assistant's answer."""
    return [Message.user(said), Message.assistant(reply)]

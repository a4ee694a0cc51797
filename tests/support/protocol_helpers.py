"""Small steps the turn-protocol tests share: a protocol on its own client, queued turns,
and whole turns to commit."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from convoq.messages import Message, ToolCall
from convoq.redis import TurnProtocol
from convoq.turn_state import TurnState, Wait


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


async def park_head(
    proto: TurnProtocol, cid: str, *, hand_to: str | None = None, **waits: Wait | None
) -> str:
    """Take the conversation's head turn and park it on the calls ``waits`` names (each
    waits for what its Wait says; None: a person decides), after handing it to
    ``hand_to`` when given (its record then names that agent). Returns its id."""
    taken = await proto.acquire(cid, worker_id="w1", lease_ms=30_000)
    assert taken is not None
    tid = taken.turn.turn_id
    if hand_to is not None:
        state = TurnState(messages=[taken.turn.input])
        await proto.transfer(cid, tid, fence=taken.fence, state=state, agent=hand_to,
                             release=False)  # fmt: skip
    calls = [ToolCall(id=c, name="job", arguments={}) for c in waits]
    state = TurnState(
        messages=[taken.turn.input, Message.assistant("", tool_calls=calls)], steps=1,
        pending=calls, waits={c: w for c, w in waits.items() if w is not None},
    )  # fmt: skip
    parked = await proto.park(cid, tid, fence=taken.fence, state=state, approval_ttl_ms=86_400_000)
    assert parked == "parked"
    return tid

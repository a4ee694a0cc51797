"""The ``transfer`` script (a handoff on workers): fenced like a checkpoint, replay-safe,
and with ``release`` the lease freed so the next run goes on as the new agent, its
``resumed`` event saying ``handed_off``, not counted as a crash."""

from __future__ import annotations

import pytest

from convoq.errors import StaleFenceError
from convoq.messages import Message
from convoq.turn_state import TurnEvent, TurnState
from tests.support.protocol_helpers import open_protocol, submit_all

CID = "transfer"
LEASE = 60_000


def _state(acquired: object) -> TurnState:
    user = acquired.turn.input  # type: ignore[attr-defined]
    return TurnState(messages=[user, Message.assistant("handing off")], steps=1)


async def test_a_transfer_moves_the_turn_once_and_frees_the_lease(
    redis_url: str, key_prefix: str
) -> None:
    async with open_protocol(redis_url, key_prefix) as proto:
        await submit_all(proto, CID, "t1")
        acquired = await proto.acquire(CID, worker_id="w", lease_ms=LEASE)
        assert acquired is not None
        state = _state(acquired)
        event = TurnEvent(type="handoff", data={"call_id": "h", "from": "bot", "to": "billing"})
        with pytest.raises(StaleFenceError):  # a stale fence writes nothing
            await proto.transfer(
                CID, "t1", fence=acquired.fence - 1, state=state, agent="billing", release=True
            )
        assert (await proto.get_turn(CID, "t1")).agent == "bot"
        for _ in range(2):  # kept (no release): a resend writes nothing again
            await proto.transfer(
                CID, "t1", fence=acquired.fence, state=state, agent="billing", release=False,
                events=[event],
            )  # fmt: skip
        record = await proto.get_turn(CID, "t1")
        assert (record.agent, record.handed_from) == ("billing", "bot")
        await proto.transfer(
            CID, "t1", fence=acquired.fence, state=state, agent="billing", release=True
        )
        assert await proto.head_agent(CID) == "billing"
        with pytest.raises(StaleFenceError):  # the lease is gone: a resend is refused
            await proto.transfer(
                CID, "t1", fence=acquired.fence, state=state, agent="billing", release=True
            )
        again = await proto.acquire(CID, worker_id="w2", lease_ms=LEASE)
        assert again is not None and again.turn.agent == "billing"
        assert again.state == state and again.turn.attempts == acquired.turn.attempts + 1
        events = [e for _, e in await proto.read_events(CID, "t1")]
        assert [e.type for e in events].count("handoff") == 1
        assert [e.data for e in events if e.type == "resumed"] == [
            {"reason": "handed_off", "attempt": acquired.turn.attempts + 1}
        ]

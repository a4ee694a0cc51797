"""Script replies become errors through one table: each refusal has one wording, the
same whichever verb was refused (a stale fence from renew, commit or the memory's fenced
append reads the same)."""

from __future__ import annotations

import pytest

from convoq.errors import (
    ConversationBusyError,
    ConvoqError,
    NotInboxHeadError,
    ProtocolError,
    StaleFenceError,
    TurnAlreadyAppliedError,
    TurnCancelledError,
    UnknownTurnError,
)
from convoq.messages import Message
from convoq.redis import TurnEnding, TurnProtocol
from convoq.redis._holding import commit_held
from convoq.redis._replies import REFUSALS, EndReply, TakeReply, refusal_error
from convoq.redis.keys import KeySchema
from tests.support.protocol_helpers import exchange, open_protocol

CID = "replies"


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("STALE", StaleFenceError),
        ("UNKNOWN", UnknownTurnError),
        ("APPLIED", TurnAlreadyAppliedError),
        ("NOT_HEAD", NotInboxHeadError),
        ("CANCELLED", TurnCancelledError),
        ("BUSY", ConversationBusyError),
        ("NOT_RUNNING", ProtocolError),
        ("SOMETHING_NEW", ProtocolError),
    ],
)
def test_each_refusal_code_has_its_error(code: str, error: type[ConvoqError]) -> None:
    found = refusal_error([code], KeySchema("p"), CID, "t1", fence=7)
    assert type(found) is error
    assert found.details["conversation_id"] == CID
    assert repr(CID) in found.message
    # A code outside the table still names itself; the table's own have their wording.
    assert (code in REFUSALS) != (repr(code) in found.message)


async def stale_errors(proto: TurnProtocol) -> list[StaleFenceError]:
    await proto.submit(CID, "t1", agent="bot", message=Message.user("t1"), options={})
    acquired = await proto.acquire(CID, worker_id="w", lease_ms=60_000)
    assert acquired is not None
    stale = acquired.fence - 1
    errors: list[StaleFenceError] = []
    with pytest.raises(StaleFenceError) as renewed:
        await proto.renew(CID, fence=stale, lease_ms=60_000, turn_id="t1")
    errors.append(renewed.value)
    with pytest.raises(StaleFenceError) as committed:
        await proto.commit(CID, "t1", exchange("t1"), TurnEnding(fence=stale))
    errors.append(committed.value)
    with pytest.raises(StaleFenceError) as appended:
        await commit_held(proto, CID, "token", stale, exchange("t1"))
    errors.append(appended.value)
    return errors


async def test_a_stale_fence_reads_the_same_from_every_verb(
    redis_url: str, key_prefix: str
) -> None:
    async with open_protocol(redis_url, key_prefix) as proto:
        errors = await stale_errors(proto)
        assert await proto.history(CID) == []  # nothing was written
    for error in errors:
        assert error.message.startswith(f"the lease on turn 't1' of conversation {CID!r}") or (
            error.message.startswith(f"the lease on conversation {CID!r}")
        )
        fence = error.details["fence"]
        assert error.message.endswith(
            f"moved on (fence {fence} is no longer current); nothing was written: stop"
            " working on it, another writer holds the conversation now"
        )


def test_replies_parse_into_records() -> None:
    assert TakeReply.parse(["RETRY", b"t2", b"t1"]) == TakeReply("RETRY", head=b"t2", failed="t1")
    assert TakeReply.parse(["EMPTY"]) == TakeReply("EMPTY")
    assert TakeReply.parse(["CORRUPT", b"k"]).refused == ["CORRUPT", b"k"]
    ended = EndReply.parse(["OK", b"t3", b"t2", [b"VERSION", b"9"]])
    assert (ended.next_turn_id, ended.failed, ended.refused) == (b"t3", "t2", ["VERSION", b"9"])
    assert EndReply.parse(["OK", None]) == EndReply(None, None)

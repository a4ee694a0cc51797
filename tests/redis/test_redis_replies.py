"""Script replies: each is parsed into a typed record in one place (``_replies.py``), a reply
of another shape raises MalformedReplyError naming its script, and refusals become errors
through one table: each refusal has one wording, the same whichever verb was refused (a
stale fence from renew, commit or the memory's fenced append reads the same)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from convoq._sync import adrive
from convoq.errors import (
    ConversationBusyError,
    ConvoqError,
    CorruptDataError,
    MalformedReplyError,
    NotInboxHeadError,
    ProtocolError,
    StaleFenceError,
    TurnAlreadyAppliedError,
    TurnCancelledError,
    UnknownTurnError,
)
from convoq.limits import QueueLimits
from convoq.messages import Message, ToolCall
from convoq.redis import TurnEnding, TurnProtocol
from convoq.redis._history import append_history
from convoq.redis._holding import commit_held, reserve, unreserve
from convoq.redis._refusals import ANY, REFUSALS, Refusal, refusal_error
from convoq.redis._replies import (
    AdmitReply,
    AppendReply,
    CancelReply,
    CountReply,
    DecideReply,
    DiscardReply,
    EndReply,
    LoadReply,
    Outcome,
    ReserveReply,
    RunningReply,
    SubmitReply,
    TakeReply,
    WindowReply,
)
from convoq.redis._summary import commit_steps, state_steps
from convoq.redis.keys import KeySchema
from convoq.summary import Summary
from convoq.turn_state import TurnState
from convoq.window import Window
from tests.support.protocol_helpers import exchange, open_protocol, submit_all

CID = "replies"
LEASE = 60_000


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
    found = refusal_error(Refusal("commit", code), KeySchema("p"), CID, "t1", fence=7)
    assert type(found) is error
    assert found.details["conversation_id"] == CID
    assert repr(CID) in found.message
    # A code outside the table still names itself and its script; the table's own have
    # their wording.
    assert ((ANY, code) in REFUSALS) != (f"the commit script answered {code!r}" in found.message)


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
    assert TakeReply.parse(["CORRUPT", b"k"]).refusal == Refusal("acquire", "CORRUPT", (b"k",))
    ended = EndReply.parse("commit", ["OK", b"t3", b"t2", [b"VERSION", b"9"]])
    assert (ended.next_turn_id, ended.failed) == (b"t3", "t2")
    assert ended.take_refusal == Refusal("commit", "VERSION", (b"9",))
    assert EndReply.parse("fail", ["OK", None]) == EndReply(None, None)
    assert EndReply.parse("fail", ["NOT_HEAD"]).refusal == Refusal("fail", "NOT_HEAD")


# Each script's parser, by script name: what the protocol reads every reply with.
PARSERS: dict[str, Callable[[Any], Any]] = {
    "submit": SubmitReply.parse,
    "admit": AdmitReply.parse,
    "acquire": TakeReply.parse,
    "load": LoadReply.parse,
    "append": AppendReply.parse,
    "window": WindowReply.parse,
    "discard": DiscardReply.parse,
    "reserve": ReserveReply.parse,
    **{name: (lambda n: lambda r: EndReply.parse(n, r))(name) for name in ("commit", "fail")},
    **{
        name: (lambda n: lambda r: RunningReply.parse(n, r))(name)
        for name in ("renew", "checkpoint", "transfer")
    },
    **{name: (lambda n: lambda r: CountReply.parse(n, r))(name) for name in ("unadmit", "prune")},
    "cancel": CancelReply.parse,
    "decide": DecideReply.parse,
    **{
        name: (lambda n: lambda r: Outcome.parse(n, r))(name)
        for name in ("clear", "park", "release", "summarise", "unreserve")
    },
}


def recorded(proto: TurnProtocol, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every reply the real scripts answer from now on, by script name (the calls still go
    to Redis as before: this only keeps a copy of what comes back)."""
    replies: dict[str, list[Any]] = {}
    run = proto.scripts.run

    async def keeping(name: str, keys: list[str], args: list[Any]) -> list[Any]:
        reply = await run(name, keys, args)
        replies.setdefault(name, []).append(reply)
        return reply

    monkeypatch.setattr(proto.scripts, "run", keeping)
    return replies


def _parked_state(acquired: Any, *call_ids: str) -> TurnState:
    calls = [ToolCall(id=c, name="pay", arguments={}) for c in call_ids]
    assistant = Message.assistant("", tool_calls=calls)
    return TurnState(messages=[acquired.turn.input, assistant], steps=1, pending=calls)


async def _drive_every_script(proto: TurnProtocol) -> dict[str, Any]:
    """Run every script of the protocol once or more, successfully; returns what the verbs
    answered, to compare with the parsed replies."""
    seen: dict[str, Any] = {}
    seen["submitted"] = await proto.submit(
        CID, "t1", agent="bot", message=Message.user("t1"), options={}, idempotency_key="k"
    )
    seen["duplicate"] = await proto.submit(
        CID, "t9", agent="bot", message=Message.user("t9"), options={}, idempotency_key="k"
    )
    await submit_all(proto, CID, "t2", "t3")
    acquired = seen["acquired"] = await proto.acquire(CID, worker_id="w", lease_ms=LEASE)
    assert acquired is not None and acquired.next_turn_id == "t2"
    assert await proto.renew(CID, fence=acquired.fence, lease_ms=LEASE, turn_id="t1") is False
    state = TurnState(messages=[acquired.turn.input])
    assert await proto.checkpoint(CID, "t1", fence=acquired.fence, state=state) is False
    await proto.transfer(CID, "t1", fence=acquired.fence, state=state, agent="bot", release=False)
    ending = TurnEnding(fence=acquired.fence, lease_ms=LEASE, next_turn_id="t2")
    handed = seen["handed"] = await proto.commit(CID, "t1", exchange("t1"), ending)
    assert handed is not None and handed.turn.turn_id == "t2"
    await proto.park(
        CID, "t2", fence=handed.fence, state=_parked_state(handed, "a"), approval_ttl_ms=LEASE
    )
    assert await proto.decide(CID, "t2", call_id="a", approved=True) == "resume"
    resumed = await proto.acquire(CID, worker_id="w", lease_ms=LEASE)
    assert resumed is not None and resumed.turn.turn_id == "t2"
    assert await proto.cancel(CID, "t3") == "cancelled"
    error = {"type": "ToolError", "message": "no", "details": {}}
    assert await proto.fail(CID, "t2", error, TurnEnding(fence=resumed.fence)) is None
    seen["uncounted"] = await proto.unadmit([(CID, "t1"), (CID, "t2"), (CID, "t3")])
    # Another conversation: a parked turn discarded, a lease handed back, an in-process hold.
    await submit_all(proto, "other", "t1")
    taken = await proto.acquire("other", worker_id="w", lease_ms=LEASE)
    assert taken is not None
    await proto.park(
        "other", "t1", fence=taken.fence, state=_parked_state(taken, "b"), approval_ttl_ms=LEASE
    )
    assert await proto.discard("other", "t1") is False
    await submit_all(proto, "other", "t2")
    again = await proto.acquire("other", worker_id="w", lease_ms=LEASE)
    assert again is not None
    assert await proto.release("other", "t2", fence=again.fence) is True
    await proto.clear("other", force=True)
    seen["fence"] = await reserve(proto, "held", "tok", lease_ms=LEASE, spent_ttl_ms=None)
    await unreserve(proto, "held", "tok")
    # Reads, a summary and a prune of the first conversation (idle now).
    assert await proto.window(CID, Window(max_tokens=10_000)) == exchange("t1")
    seen["loaded"] = await proto.scripts.run("load", proto.keys.history_keys(CID), [1])
    _, _, basis = await adrive(state_steps(proto.keys, CID), proto.scripts.perform)
    summary = Summary.of("said t1", watermark=1, version=1)
    await adrive(commit_steps(proto.keys, CID, summary, basis), proto.scripts.perform)
    seen["dropped"] = await proto.prune(CID, keep_last_turns=0)
    # A memory's append, then the same append again (applied before: nothing written).
    turn = exchange("t4")
    for key in ("appended", "replayed"):
        seen[key] = await append_history(
            proto.scripts, proto.keys, "mem", turn, proto.limits, append_id="a1"
        )
    return seen


async def test_real_replies_parse_into_their_records(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_protocol(
        redis_url, key_prefix, queue_limits=QueueLimits(per_agent=100)
    ) as proto:
        replies = recorded(proto, monkeypatch)
        seen = await _drive_every_script(proto)
    assert set(replies) >= set(PARSERS)  # every parser met a real reply
    parsed = {name: [PARSERS[name](r) for r in found] for name, found in replies.items()}
    for records in parsed.values():
        assert all(getattr(record, "refusal", None) is None for record in records)
    first, dup = parsed["submit"][0], parsed["submit"][1]
    assert (first.status, first.position, first.event_id) == ("OK", 0, seen["submitted"].event_id)
    assert first.created_ms == seen["submitted"].created_ms > 0
    assert (dup.status, dup.turn_id, dup.position) == ("DUP", "t1", 0)
    assert parsed["admit"][0] == AdmitReply()
    taken = parsed["acquire"][0].taken
    assert taken.fence == seen["acquired"].fence and taken.next_turn_id == b"t2"
    assert taken.fields["status"] == b"running"
    committed = parsed["commit"][0]
    assert committed.next_turn_id == b"t2" and committed.taken.fence == seen["handed"].fence
    assert parsed["fail"][0] == EndReply(None, None)
    assert parsed["renew"][0] == parsed["checkpoint"][0] == RunningReply(cancel_requested=False)
    assert parsed["reserve"][0] == ReserveReply(fence=seen["fence"])
    assert parsed["unadmit"][-1] == CountReply(seen["uncounted"]) == CountReply(3)
    assert parsed["prune"][0] == CountReply(seen["dropped"]) == CountReply(1)
    assert parsed["discard"][0] == DiscardReply(queued=0)
    assert parsed["decide"] == [DecideReply("RESUME", "bot")]  # the resume kick's agent
    assert parsed["cancel"] == [CancelReply("CANCELLED", "t2")]  # the head, behind t3's end
    assert parsed["park"][0] == parsed["clear"][0] == Outcome("OK")
    assert parsed["append"] == [AppendReply(True), AppendReply(False)]
    assert (seen["appended"], seen["replayed"]) == (True, False)
    loaded = LoadReply.parse(seen["loaded"])
    assert loaded.lead == [] and len(loaded.elements) == 1
    window = parsed["window"][0]
    assert window.done and window.inline is not None and (window.first, window.last) == (0, 0)


@pytest.mark.parametrize(
    ("script", "reply"),
    [
        ("submit", ["OK", 0, b"1-0"]),  # too short
        ("submit", ["OK", b"first", b"1-0", b"5", 0]),  # a position that is no integer
        ("submit", ["DUP", b"t1", 0, b"more"]),  # too long
        ("admit", ["FULL", b"total"]),
        ("acquire", ["OK", 5]),
        ("acquire", ["RETRY"]),
        ("commit", ["OK", b"t2", None, [b"OK", 1]]),  # the carried take is short
        ("fail", ["OK", 7]),  # the next turn's id is no string
        ("renew", ["OK", b"2"]),  # the cancel flag is neither '0' nor '1'
        ("checkpoint", ["OK"]),
        ("reserve", ["OK", None]),
        ("discard", ["FINISHED", b"cancelled", 0]),  # the inbox head is missing
        ("discard", ["OK", 1]),
        ("prune", ["OK", [1]]),
        ("clear", ["OK", b"extra"]),
        ("window", ["DONE", 0, -1, None, []]),  # inline answers carry three lists
        ("window", ["MORE", 1, 2, 3]),
        ("load", ["OK", [], []]),
        ("append", ["OK"]),  # the total is missing
        ("append", ["APPLIED", 1]),
        ("cancel", []),  # no status at all
        ("cancel", ["CANCELLED"]),  # the inbox head (or false) is missing
        ("cancel", ["STOPPING", b"t1"]),
        ("decide", None),
        ("decide", ["RESUME"]),  # the agent (or false) is missing
        ("decide", ["PENDING", b"bot"]),
        ("park", [7]),  # a status that is no string
    ],
)
def test_a_malformed_reply_names_its_script(script: str, reply: Any) -> None:
    with pytest.raises(MalformedReplyError) as raised:
        PARSERS[script](reply)
    assert raised.value.message.startswith(f"the {script} script answered ")
    assert raised.value.details["script"] == script
    assert "check that the server is Redis 6.2 or later" in raised.value.message


def test_a_refusal_missing_what_it_names_is_malformed() -> None:
    keys = KeySchema("p")
    with pytest.raises(MalformedReplyError, match="the prune script answered"):
        refusal_error(Refusal("prune", "CORRUPT"), keys, CID, None)
    corrupt = refusal_error(Refusal("prune", "CORRUPT", (b"p:{x}:turns",)), keys, CID, None)
    assert isinstance(corrupt, CorruptDataError) and corrupt.details["key"] == "p:{x}:turns"


async def test_refusals_a_script_words_its_own_way_come_from_real_calls(
    redis_url: str, key_prefix: str
) -> None:
    """The ``(script, code)`` entries of the table: one script's refusal that reads
    otherwise than the same code of another (prune's and reserve's BUSY, renew's ENDED,
    discard's FINISHED, reserve's GONE)."""
    async with open_protocol(redis_url, key_prefix) as proto:
        await submit_all(proto, CID, "t1", "t2")
        with pytest.raises(ConversationBusyError, match="prune it once it is idle"):
            await proto.prune(CID, keep_last_turns=0)
        with pytest.raises(ConversationBusyError, match="or use if_busy='wait'"):
            await reserve(proto, CID, "tok", lease_ms=LEASE, spent_ttl_ms=None)
        acquired = await proto.acquire(CID, worker_id="w", lease_ms=LEASE)
        assert acquired is not None
        with pytest.raises(NotInboxHeadError, match="no longer running under this lease"):
            await proto.renew(CID, fence=acquired.fence, lease_ms=LEASE, turn_id="t2")
        await proto.commit(CID, "t1", exchange("t1"), TurnEnding(fence=acquired.fence))
        with pytest.raises(TurnAlreadyAppliedError, match="was already committed"):
            await proto.discard(CID, "t1")
        with pytest.raises(ConvoqError, match="approval expired \\(or its conversation"):
            await reserve(proto, "idle", "tok", lease_ms=LEASE, spent_ttl_ms=LEASE)

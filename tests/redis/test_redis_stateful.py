"""Random interleavings of the turn protocol from several workers against a real Redis,
checked step by step against a plain-Python model of what must happen: runs reported cut
off and failed turns retried among them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from convoq._sync import run_sync
from convoq.errors import (
    NotInboxHeadError,
    ProtocolError,
    StaleFenceError,
    TurnAlreadyAppliedError,
    TurnCancelledError,
    TurnNotRetryableError,
)
from convoq.messages import Message, ToolCall
from convoq.redis import Acquired, TurnProtocol
from convoq.redis.protocol import TurnEnding
from convoq.turn_state import TurnState
from tests.support.redis_cluster import plain_client

CID = "stateful"
WORKERS = ("w1", "w2", "w3")
MAX_ATTEMPTS = 3
MAX_CUT_OFFS = 2
LEASE_MS = 60_000
TERMINAL = {"succeeded", "failed", "cancelled"}


@dataclass
class Lease:
    fence: int
    state: str  # active | parked


@dataclass
class Model:
    """What Redis must hold after every step."""

    queue: list[str] = field(default_factory=list)
    status: dict[str, str] = field(default_factory=dict)
    history: list[str] = field(default_factory=list)
    runs: dict[str, int] = field(default_factory=dict)
    lease: Lease | None = None
    pending: list[str] = field(default_factory=list)  # call ids of the parked head
    decided: set[str] = field(default_factory=set)
    resume: bool = False
    saved: dict[str, int] = field(default_factory=dict)  # tid -> steps of the saved state
    last_fence: int = 0
    cut_offs: dict[str, int] = field(default_factory=dict)  # runs reported cut off
    cut_fence: dict[str, int] = field(default_factory=dict)  # newest fence reported
    retries: dict[str, int] = field(default_factory=dict)
    retry_token: dict[str, str] = field(default_factory=dict)

    def end(self, tid: str, status: str) -> None:
        self.status[tid] = status
        if tid in self.queue:
            self.queue.remove(tid)
        if status != "failed":  # a failed turn keeps its journal for a retry
            self.saved.pop(tid, None)

    def take(self, handoff: bool) -> str | None:
        """The turn acquire hands out (failing heads over max attempts on the way), or None."""
        while self.queue:
            head = self.queue[0]
            # A parked head whose approval expired with its lease runs on (its undecided
            # calls recorded as expired), as a resumed one does: with the run that parked
            # it (max attempts counts the runs that started).
            parked = self.status[head] == "awaiting_approval"
            runs = self.runs.get(head, 0) + (0 if parked else 1)
            # Max attempts counts the runs nobody reported (crashed); cut-offs apart. A
            # turn failed here keeps the runs it had.
            over_cut_offs = not parked and self.cut_offs.get(head, 0) >= MAX_CUT_OFFS
            if runs > MAX_ATTEMPTS or over_cut_offs:
                self.end(head, "failed")
                continue
            self.runs[head] = runs
            self.status[head] = "running"
            self.resume = False
            if not handoff:
                self.lease = Lease(fence=0, state="active")  # fence filled in by the caller
            return head
        if handoff:
            self.lease = None
        return None

    def guard(self, tid: str, fence: int, allowed: set[str]) -> type[Exception] | None:
        if self.status[tid] in TERMINAL:
            return TurnAlreadyAppliedError
        if self.lease is None or self.lease.fence != fence or self.lease.state != "active":
            return StaleFenceError
        if not self.queue or self.queue[0] != tid:
            return NotInboxHeadError
        if self.status[tid] not in allowed:
            return ProtocolError
        return None


class TurnProtocolMachine(RuleBasedStateMachine):
    def __init__(self, url: str) -> None:
        super().__init__()
        self.proto = TurnProtocol.from_url(url, prefix=f"s{uuid.uuid4().hex[:10]}")
        self.client = plain_client(url)
        self.model = Model()
        # worker -> (turn id, fence, the turn queued behind it then) of the turn it holds
        self.claims: dict[str, tuple[str, int, str | None]] = {}
        self.count = 0

    def teardown(self) -> None:
        run_sync(self.proto.clear(CID, force=True))
        run_sync(self.proto.close())
        self.client.close()

    # -- helpers -----------------------------------------------------------------------
    def expect(self, error: type[Exception] | None, call: Any) -> Any:
        if error is None:
            return run_sync(call)
        with pytest.raises(error):
            run_sync(call)
        return None

    def received(self, worker: str, got: Acquired | None, expected: str | None, fence: int) -> None:
        """Check what acquire/commit/fail handed out against the model's choice."""
        if expected is None:
            assert got is None
            self.claims.pop(worker, None)
            return
        assert got is not None
        assert got.turn.turn_id == expected
        assert got.turn.status == "running"
        if fence:
            assert got.fence == fence
        else:
            assert got.fence > self.model.last_fence
            assert self.model.lease is not None
            self.model.lease.fence = got.fence
            self.model.last_fence = got.fence
        saved = self.model.saved.get(expected)
        assert (got.state.steps if got.state else None) == saved
        assert [m.text for m in got.history if m.role == "user"] == self.model.history
        queue = self.model.queue
        assert got.next_turn_id == (queue[1] if len(queue) > 1 else None)  # the peek
        self.claims[worker] = (expected, got.fence, got.next_turn_id)

    # -- rules -------------------------------------------------------------------------
    @rule()
    def submit(self) -> None:
        self.count += 1
        tid = f"t{self.count}"
        result = run_sync(
            self.proto.submit(CID, tid, agent="bot", message=Message.user(tid), options={})
        )
        assert result.position == len(self.model.queue)
        self.model.queue.append(tid)
        self.model.status[tid] = "queued"

    @rule(worker=st.sampled_from(WORKERS))
    def acquire(self, worker: str) -> None:
        got = run_sync(
            self.proto.acquire(
                CID,
                worker_id=worker,
                lease_ms=LEASE_MS,
                max_attempts=MAX_ATTEMPTS,
                max_cut_offs=MAX_CUT_OFFS,
            )
        )
        expected = None if self.model.lease is not None else self.model.take(handoff=False)
        self.received(worker, got, expected, 0)

    def ending(self, worker: str, allowed: set[str], call: Any, final: str | None) -> None:
        """Run ``call(tid, fence, peek)`` for the turn ``worker`` holds and check it."""
        tid, fence, peek = self.claims[worker]
        error = self.model.guard(tid, fence, allowed)
        got = self.expect(error, call(tid, fence, peek))
        if error is not None:
            return
        if final is None:  # checkpoint
            self.model.saved[tid] = 7
            return
        if final == "succeeded":
            self.model.history.append(tid)
        self.model.end(tid, final)
        self.received(worker, got, self.model.take(handoff=True), fence)

    # Commit and fail pass the peek the worker got with its turn (``peeked``), so the
    # script hands out the next turn itself when the peek still holds (or names the head
    # to acquire when it went stale), or no peek: the same outcome either way.
    @precondition(lambda self: self.claims)
    @rule(data=st.data(), peeked=st.booleans())
    def commit(self, data: st.DataObject, peeked: bool) -> None:
        worker = data.draw(st.sampled_from(sorted(self.claims)))
        self.ending(
            worker,
            {"running"},
            lambda tid, fence, peek: self.proto.commit(
                CID,
                tid,
                [Message.user(tid), Message.assistant("ok")],
                TurnEnding(
                    fence=fence,
                    lease_ms=LEASE_MS,
                    max_attempts=MAX_ATTEMPTS,
                    max_cut_offs=MAX_CUT_OFFS,
                    next_turn_id=peek if peeked else None,
                ),
            ),
            "succeeded",
        )

    @precondition(lambda self: self.claims)
    @rule(data=st.data(), cancelled=st.booleans(), peeked=st.booleans())
    def fail(self, data: st.DataObject, cancelled: bool, peeked: bool) -> None:
        worker = data.draw(st.sampled_from(sorted(self.claims)))
        error = (TurnCancelledError if cancelled else ProtocolError)("boom").to_data()
        self.ending(
            worker,
            {"running", "queued"},
            lambda tid, fence, peek: self.proto.fail(
                CID,
                tid,
                error,
                TurnEnding(
                    fence=fence,
                    lease_ms=LEASE_MS,
                    max_attempts=MAX_ATTEMPTS,
                    max_cut_offs=MAX_CUT_OFFS,
                    next_turn_id=peek if peeked else None,
                ),
            ),
            "cancelled" if cancelled else "failed",
        )

    @precondition(lambda self: self.claims)
    @rule(data=st.data())
    def checkpoint(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from(sorted(self.claims)))
        state = TurnState(messages=[Message.user("x")], steps=7)
        self.ending(
            worker,
            {"running"},
            lambda tid, fence, _peek: self.proto.checkpoint(CID, tid, fence=fence, state=state),
            None,
        )

    @precondition(lambda self: self.claims)
    @rule(data=st.data(), calls=st.integers(1, 2))
    def park(self, data: st.DataObject, calls: int) -> None:
        worker = data.draw(st.sampled_from(sorted(self.claims)))
        tid, fence, _peek = self.claims[worker]
        ids = [f"c{i}" for i in range(calls)]
        pending = [ToolCall(id=c, name="tool") for c in ids]
        state = TurnState(messages=[Message.user(tid)], steps=3, pending=pending)
        lease = self.model.lease
        replay = (
            lease is not None
            and lease.fence == fence
            and lease.state == "parked"
            and self.model.status[tid] == "awaiting_approval"
        )
        error = None if replay else self.model.guard(tid, fence, {"running"})
        self.expect(
            error, self.proto.park(CID, tid, fence=fence, state=state, approval_ttl_ms=LEASE_MS)
        )
        if error is None and not replay:
            assert lease is not None
            lease.state = "parked"
            self.model.status[tid] = "awaiting_approval"
            self.model.pending, self.model.decided, self.model.resume = ids, set(), False
            self.model.saved[tid] = 3

    def parked_head(self) -> str | None:
        queue = self.model.queue
        return queue[0] if queue and self.model.status[queue[0]] == "awaiting_approval" else None

    @precondition(lambda self: self.parked_head() is not None)
    @rule(index=st.integers(0, 1))
    def decide(self, index: int) -> None:
        tid = self.parked_head()
        assert tid is not None
        call = self.model.pending[index % len(self.model.pending)]
        m = self.model
        if call not in m.decided and not m.resume and m.lease is None:
            self.expect(ProtocolError, self.proto.decide(CID, tid, call_id=call, approved=True))
            return
        got = run_sync(self.proto.decide(CID, tid, call_id=call, approved=True))
        m.decided.add(call)
        if set(m.pending) <= m.decided:
            assert got == "resume"
            m.resume, m.lease = True, None
        else:
            assert got == "pending"

    @precondition(lambda self: self.parked_head() is not None)
    @rule()
    def discard(self) -> None:
        tid = self.parked_head()
        assert tid is not None
        more = run_sync(self.proto.discard(CID, tid))
        self.model.end(tid, "cancelled")
        self.model.lease = None
        assert more == bool(self.model.queue)

    @precondition(lambda self: self.model.status)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        tid = data.draw(st.sampled_from(sorted(self.model.status)))
        m = self.model
        got = run_sync(self.proto.cancel(CID, tid))
        if m.status[tid] in TERMINAL:
            assert got == "finished"
        elif m.status[tid] == "running" and m.lease is not None and m.lease.state == "active":
            assert got == "stopping"
        else:
            assert got == "cancelled"
            if m.status[tid] == "awaiting_approval":
                m.lease = None
            m.end(tid, "cancelled")

    @rule()
    def lease_expires(self) -> None:
        self.client.delete(self.proto.keys.lease(CID))
        self.model.lease = None

    @precondition(lambda self: self.claims)
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from(sorted(self.claims)))
        _tid, fence, _peek = self.claims[worker]
        lease = self.model.lease
        live = lease is not None and lease.fence == fence and lease.state == "active"
        self.expect(
            None if live else StaleFenceError, self.proto.renew(CID, fence=fence, lease_ms=LEASE_MS)
        )

    @precondition(lambda self: self.claims)
    @rule(data=st.data())
    def report_cut_off(self, data: st.DataObject) -> None:
        """A worker that lived reports the run it holds (or held) cut off."""
        worker = data.draw(st.sampled_from(sorted(self.claims)))
        tid, fence, _peek = self.claims[worker]
        m = self.model
        counted = (
            m.status[tid] in ("running", "awaiting_approval")
            and fence > m.cut_fence.get(tid, 0)
            and m.runs.get(tid, 0) > 0
        )
        assert run_sync(self.proto.report_cut_off(CID, tid, fence=fence)) == counted
        if not counted:
            return
        m.runs[tid] -= 1
        m.cut_offs[tid] = m.cut_offs.get(tid, 0) + 1
        m.cut_fence[tid] = fence
        lease = m.lease
        if lease and lease.fence == fence and lease.state == "active" and m.queue[0] == tid:
            m.lease = None  # the run's lease is freed for the next run

    @precondition(lambda self: self.model.status)
    @rule(data=st.data(), resend=st.booleans())
    def retry(self, data: st.DataObject, resend: bool) -> None:
        """A failed turn queued again as itself; a resend of the last request (its token)
        changes nothing; any other turn is refused."""
        tid = data.draw(st.sampled_from(sorted(self.model.status)))
        m = self.model
        token = m.retry_token.get(tid) if resend else None
        got = None
        if token is not None:
            got = run_sync(self.proto.retry(CID, tid, token=token))
            assert got.repeated and got.status == m.status[tid]
            return
        token = uuid.uuid4().hex
        if m.status[tid] != "failed":
            self.expect(TurnNotRetryableError, self.proto.retry(CID, tid, token=token))
            return
        got = run_sync(self.proto.retry(CID, tid, token=token))
        assert (got.repeated, got.position) == (False, len(m.queue))
        m.retries[tid] = m.retries.get(tid, 0) + 1
        assert got.retries == m.retries[tid]
        m.retry_token[tid] = token
        m.queue.append(tid)
        m.status[tid] = "queued"
        m.runs[tid], m.cut_offs[tid], m.cut_fence[tid] = 0, 0, m.last_fence

    # -- invariants --------------------------------------------------------------------
    @invariant()
    def redis_matches_the_model(self) -> None:
        keys, m = self.proto.keys, self.model
        inbox = [t.decode() for t in self.client.lrange(keys.inbox(CID), 0, -1)]
        assert inbox == m.queue
        stored = [m_.text for m_ in run_sync(self.proto.history(CID)) if m_.role == "user"]
        assert stored == m.history  # committed once each, in submission order
        assert sorted(stored, key=lambda t: int(t[1:])) == stored
        for tid, status in m.status.items():
            fields = ["status", "runs", "cut_offs", "retries"]
            record = [v and v.decode() for v in self.client.hmget(keys.turn(CID, tid), fields)]
            assert record[0] == status
            assert int(record[1] or 0) == m.runs.get(tid, 0)
            assert int(record[2] or 0) == m.cut_offs.get(tid, 0)
            assert int(record[3] or 0) == m.retries.get(tid, 0)
        lease = self.client.hmget(keys.lease(CID), "fence", "state")
        if m.lease is None:
            assert lease == [None, None]
        else:
            assert lease == [str(m.lease.fence).encode(), m.lease.state.encode()]
        holders = {f for _t, f, _p in self.claims.values() if m.lease and f == m.lease.fence}
        assert len(holders) <= 1  # at most one live lease


@pytest.mark.timeout(110)
def test_turn_protocol_state_machine(store_url: str) -> None:
    run_state_machine_as_test(
        lambda: TurnProtocolMachine(store_url),
        settings=settings(max_examples=30, stateful_step_count=30, deadline=None),
    )

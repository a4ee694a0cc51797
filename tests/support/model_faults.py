"""A loopback model server that fails on purpose: 429 storms with ``Retry-After``, 5xx,
hangs past the model's deadline, and streams dropped part way (closed or reset).

:class:`FaultyWireServer` answers as :class:`~tests.support.wire_server.WireServer` does,
and before answering decides whether this request fails instead. Faults are counted per
*model call*: the requests one call of a model makes (its first attempt and its retries)
carry one ``x-chaos-call`` header (see :mod:`tests.support.model_fault_agents`). A call
gets at most ``budget`` faults (its model's ``max_retries``), so every call a retry can
save is saved by the retries the model is allowed: a turn that fails anyway is a bug.
A stream of text is dropped before any text went out or after some did (every other
drop): the model retries both, the second after it retracted the text that went out (a
``text_retracted`` event). A turn whose user text is in ``refuse``
gets 503 for its final answer whatever the budget: it fails, to be retried as a turn.

Every request is logged as a :class:`Hit`; :func:`broken_promises` reads the log for
what the model's retries promise (budget, ``Retry-After``, bounded hangs, no call given
up while its worker lived).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

from tests.support.openai_server import RecordedRequest, _Reply
from tests.support.wire_server import Script, WireServer, read

KINDS = ("5xx", "hang", "drop-closed", "429", "drop-reset")


@dataclass
class Hit:
    """One request as the server took it: its call, the worker process, when it came
    (``time.monotonic()``), and the fault it got (None: answered)."""

    call: str
    pid: int
    at: float
    fault: str | None


@dataclass
class Plan:
    """When to fail: every ``round(1 / rate)``-th request (counted over all calls) whose
    call has budget left gets the next kind of :data:`KINDS` in turn; during a 429 storm
    (the last ``storm_s`` of every ``storm_every_s``) every request with budget left gets
    429 with ``Retry-After``. A call gets at most ``budget`` faults."""

    budget: int
    rate: float = 0.35
    storm_every_s: float = 6.0
    storm_s: float = 1.5
    retry_after_s: int = 1
    hang_s: float = 3.0  # past the model's attempt deadline


class FaultyWireServer(WireServer):
    """A :class:`WireServer` that fails requests as ``plan`` says."""

    def __init__(self, script: Script, plan: Plan) -> None:
        super().__init__(script)
        self.plan = plan
        self.hits: list[Hit] = []
        self._faults: dict[str, int] = defaultdict(int)
        self._turn = itertools.count()
        self._kinds = itertools.cycle(KINDS)
        self._hit_lock = threading.Lock()
        self.text_drops = 0  # streams of text dropped (every other one after text went out)
        self.started = time.monotonic()
        self.refuse: set[str] = set()  # user texts whose final answers always get a 503

    def _record(self, request: RecordedRequest) -> _Reply:
        reply = super()._record(request)
        call = request.headers.get("x-chaos-call", "")
        pid = int(request.headers.get("x-chaos-pid", "0"))
        with self._hit_lock:
            fault = "refused" if self._refused(request) else self._fault_for(call)
            self.hits.append(Hit(call, pid, time.monotonic(), fault))
        return reply if fault is None else self._failing(fault, reply)

    def _refused(self, request: RecordedRequest) -> bool:
        """Whether the request is one of a turn in ``refuse`` asking for its final answer
        (its tool's result is in): such a call fails past any retry budget."""
        items = read(request).items
        users = [i.text for i in items if i.role == "user"]
        return bool(users) and users[-1] in self.refuse and items[-1].role == "tool"

    def in_storm(self) -> bool:
        into = (time.monotonic() - self.started) % self.plan.storm_every_s
        return into >= self.plan.storm_every_s - self.plan.storm_s

    def _fault_for(self, call: str) -> str | None:
        if not call or self._faults[call] >= self.plan.budget:
            return None
        if self.in_storm():
            fault = "429"
        elif next(self._turn) % round(1 / self.plan.rate) == 0:
            fault = next(self._kinds)
        else:
            return None
        self._faults[call] += 1
        return fault

    def _failing(self, fault: str, answer: _Reply) -> _Reply:
        if fault == "429":
            headers = {"Retry-After": str(self.plan.retry_after_s)}
            return _Reply(status=429, headers=headers, body=_error("rate limited"))
        if fault in ("5xx", "refused"):
            return _Reply(status=503, body=_error("overloaded"))
        if fault == "hang":
            answer.delay = self.plan.hang_s  # the answer comes after the client gave up
            return answer
        # A text answer drops after the role chunk (before any text) or after its first
        # text chunk (text went out: the model retracts it and retries), in turn; a tool
        # call's inside its chunks (id and name, first half of the arguments).
        text = (answer.message or {}).get("content")
        with self._hit_lock:
            self.text_drops += bool(text)
            after_text = bool(text) and self.text_drops % 2 == 0
        answer.cut_after = (2 if after_text else 1) if text else 1 + len(self.hits) % 3
        answer.reset = fault == "drop-reset"
        return answer

    def last_fault_at(self) -> float:
        with self._hit_lock:
            return max((h.at for h in self.hits if h.fault), default=self.started)


def _error(message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "test_error"}}).encode()


@dataclass
class Promises:
    """What the model's retries promise, and the numbers behind it."""

    max_retries: int
    attempt_timeout_s: float
    max_backoff_s: float

    def broken(self, hits: list[Hit], killed: set[int], slack_s: float = 3.0) -> list[str]:
        """Each promise the log shows broken: more requests in a call than its budget; a
        retry after 429 sooner than ``Retry-After``; a hang not given up on within the
        deadline plus a backoff; a call that ended on a fault although its worker lived
        (unless refused: then it must have spent its whole budget)."""
        calls: dict[str, list[Hit]] = defaultdict(list)
        for hit in hits:
            calls[hit.call].append(hit)
        broken = []
        for call, its in calls.items():
            if len(its) > 1 + self.max_retries:
                broken.append(f"call {call}: {len(its)} requests > 1 + {self.max_retries}")
            for before, after in itertools.pairwise(its):
                gap = after.at - before.at
                if before.fault == "429" and gap < 1.0 - 0.05:
                    broken.append(f"call {call}: retried {gap:.2f} s after a 429 (Retry-After 1)")
                bound = self.attempt_timeout_s + self.max_backoff_s + slack_s
                # Given up at the deadline (the server saw the request a little after the
                # client started its clock), not at once and not much later.
                if before.fault == "hang" and not self.attempt_timeout_s - 0.5 <= gap <= bound:
                    broken.append(f"call {call}: retried {gap:.2f} s after a hang")
            refused = its[-1].fault == "refused"
            if refused and len(its) != 1 + self.max_retries and its[-1].pid not in killed:
                broken.append(f"call {call}: gave up after {len(its)} requests, not all")
            if its[-1].fault not in (None, "refused") and its[-1].pid not in killed:
                broken.append(f"call {call}: ended on {its[-1].fault}, its worker alive")
        return broken

"""Script replies as types: each Lua script's reply parsed once, into a small record.

A Lua script answers with a list whose first item is a status. Every reply is parsed
here (``SubmitReply.parse(reply)``, ``Outcome.parse("cancel", reply)``, ...); no other
module reads a reply by position. Each item is checked as it is read: a reply of another
shape (too short, too long, an item of the wrong type) raises
:class:`~convoq.errors.MalformedReplyError` naming the script, never an IndexError. A
status that is no success of its script comes out as a
:class:`~convoq.redis._refusals.Refusal`, which
:func:`~convoq.redis._refusals.refusal_error` turns into its error (the one table of
refusals, :mod:`convoq.redis._refusals`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from convoq.redis._codec import pairs_to_dict, text
from convoq.redis._refusals import Refusal, malformed


class _Items:
    """A script reply read item by item (1: the item after the status), each checked."""

    def __init__(self, script: str, reply: Any) -> None:
        status = reply[0] if isinstance(reply, list) and reply else None
        if not isinstance(status, (str, bytes)):
            raise malformed(script, reply, "a list that starts with a status")
        self.script, self.reply, self.status = script, reply, text(status)

    def sized(self, least: int, most: int | None = None) -> _Items:
        """Check that ``least`` to ``most`` (default: exactly ``least``) items follow."""
        most = least if most is None else most
        if not least <= len(self.reply) - 1 <= most:
            span = str(least) if least == most else f"{least} to {most}"
            raise malformed(self.script, self.reply, f"{self.status} and {span} item(s)")
        return self

    def _get(self, i: int, types: tuple[type, ...], what: str, optional: bool = False) -> Any:
        value = self.reply[i] if i < len(self.reply) else None
        if (value is None and optional) or (
            isinstance(value, types) and not isinstance(value, bool)
        ):
            return value
        raise malformed(self.script, self.reply, f"{self.status} with {what} as item {i}")

    def integer(self, i: int) -> int:
        value = self._get(i, (int, bytes), "an integer")
        try:
            return int(value)
        except ValueError:
            raise malformed(
                self.script, self.reply, f"{self.status} with an integer as item {i}"
            ) from None

    def string(self, i: int) -> str:
        return text(self._get(i, (bytes, str), "a string"))

    def raw(self, i: int) -> bytes | None:
        """A string item, or None for Lua's false or an absent item."""
        value: bytes | None = self._get(i, (bytes,), "a string or nothing", optional=True)
        return value

    def name(self, i: int) -> str | None:
        """A string item as text (an agent, a turn id), or None for Lua's false."""
        value = self.raw(i)
        return None if value is None else text(value)

    def array(self, i: int, optional: bool = False) -> Any:
        return self._get(i, (list,), "a list", optional)

    def pairs(self, i: int) -> dict[str, bytes]:
        flat = self.array(i)
        if len(flat) % 2 or not all(isinstance(item, bytes) for item in flat):
            raise malformed(self.script, self.reply, f"name/value pairs as item {i}")
        return pairs_to_dict(flat)

    def flag(self, i: int) -> bool:
        value = self._get(i, (bytes,), "'0' or '1'")
        if value not in (b"0", b"1"):
            raise malformed(self.script, self.reply, f"'0' or '1' as item {i}")
        return bool(value == b"1")

    def refusal(self) -> Refusal:
        return Refusal(self.script, self.status, tuple(self.reply[1:]))


@dataclass(frozen=True)
class Outcome:
    """The reply of a script that answers a status alone: one of its successes
    (:data:`OUTCOMES`), else ``refusal``."""

    status: str
    refusal: Refusal | None = None

    @classmethod
    def parse(cls, script: str, reply: Any) -> Outcome:
        items = _Items(script, reply)
        if items.status in OUTCOMES[script]:
            return cls(items.sized(0).status)
        return cls(items.status, items.refusal())


OUTCOMES: dict[str, tuple[str, ...]] = {
    "clear": ("OK", "RETRY"),  # RETRY: the inbox changed since it was read: read again
    "park": ("OK", "PARKED", "RESUME", "RESUMED"),  # PARKED, RESUMED: a replay
    "pop": ("OK", "APPLIED", "EMPTY", "CHANGED"),  # APPLIED: a replay; CHANGED: read again
    "release": ("OK", "STALE"),  # STALE: the lease had moved on, nothing to release
    "summarise": ("OK",),
    "unreserve": ("OK", "GONE"),  # GONE: the lease is not this holder's (any more)
}
"""The success statuses of each script whose reply is a status alone."""


@dataclass(frozen=True)
class DecideReply:
    """``decide``: 'RESUME' or 'KEPT_RESUME' (a repeat) with the ``agent`` the turn's
    record names (None: none), 'PENDING' or 'KEPT_PENDING'; else ``refusal``."""

    status: str
    agent: str | None = None
    refusal: Refusal | None = None

    @classmethod
    def parse(cls, reply: Any) -> DecideReply:
        r = _Items("decide", reply)
        if r.status in ("RESUME", "KEPT_RESUME"):
            return cls(r.status, r.sized(1).name(1))
        if r.status in ("PENDING", "KEPT_PENDING"):
            return cls(r.sized(0).status)
        return cls(r.status, refusal=r.refusal())


@dataclass(frozen=True)
class CancelReply:
    """``cancel``: 'CANCELLED' (ended here; ``head``: the conversation's inbox head now,
    None when no turn waits), 'STOPPING' or 'FINISHED'; else ``refusal``."""

    status: str
    head: str | None = None
    refusal: Refusal | None = None

    @classmethod
    def parse(cls, reply: Any) -> CancelReply:
        r = _Items("cancel", reply)
        if r.status == "CANCELLED":
            return cls(r.status, r.sized(1).name(1))
        if r.status in ("STOPPING", "FINISHED"):
            return cls(r.sized(0).status)
        return cls(r.status, refusal=r.refusal())


@dataclass(frozen=True)
class SubmitReply:
    """``submit``: 'OK' (queued at ``position`` with its first event ``event_id`` at
    ``created_ms``; ``kicked``: the script pushed the kick; ``stopped``: what became of
    the inbox head, '' nothing), 'DUP' (an earlier submit queued ``turn_id`` at
    ``position``, -1 when it left the inbox), 'MERGED' (joined the queued ``turn_id`` at
    ``position``), 'MOVED' (the head or tail read before moved on: read again), 'FULL'
    (``waiting`` turns fill the inbox), else ``refusal``."""

    status: str
    position: int = 0
    event_id: str = ""
    created_ms: int = 0
    kicked: bool = False
    turn_id: str = ""
    waiting: int = 0
    refusal: Refusal | None = None
    stopped: str = ""

    @classmethod
    def parse(cls, reply: Any) -> SubmitReply:
        r = _Items("submit", reply)
        if r.status == "OK":
            r.sized(5)
            return cls(
                "OK",
                r.integer(1),
                r.string(2),
                r.integer(3),
                kicked=r.integer(4) == 1,
                stopped=r.string(5),
            )
        if r.status in ("DUP", "MERGED"):
            return cls(r.status, r.sized(2).integer(2), turn_id=r.string(1))
        if r.status == "MOVED":
            return cls(r.sized(0).status)
        if r.status == "FULL":
            return cls("FULL", waiting=r.sized(1).integer(1))
        return cls(r.status, refusal=r.refusal())


@dataclass(frozen=True)
class AdmitReply:
    """``admit``: counted ('OK'), or ``full`` names the limit reached ('total' or
    'agent') at ``count`` turns; else ``refusal``."""

    full: str | None = None
    count: int = 0
    refusal: Refusal | None = None

    @classmethod
    def parse(cls, reply: Any) -> AdmitReply:
        r = _Items("admit", reply)
        if r.status == "OK":
            r.sized(0)
            return cls()
        if r.status == "FULL":
            return cls(r.sized(2).string(1), r.integer(2))
        return cls(refusal=r.refusal())


@dataclass(frozen=True)
class CountReply:
    """'OK' and a count: turns uncounted (``unadmit``) or dropped (``prune``); else
    ``refusal``."""

    count: int = 0
    refusal: Refusal | None = None

    @classmethod
    def parse(cls, script: str, reply: Any) -> CountReply:
        r = _Items(script, reply)
        if r.status == "OK":
            return cls(r.sized(1).integer(1))
        return cls(refusal=r.refusal())


@dataclass(frozen=True)
class DiscardReply:
    """``discard``: the turn ended cancelled, ``queued`` turns wait behind it, ``head``
    first (None: none) ('OK', or 'FINISHED' as cancelled: a replay); else ``refusal``
    ('FINISHED' otherwise: it ended another way)."""

    queued: int = 0
    refusal: Refusal | None = None
    head: str | None = None

    @classmethod
    def parse(cls, reply: Any) -> DiscardReply:
        r = _Items("discard", reply)
        if r.status == "OK":
            return cls(r.sized(2).integer(1), head=r.name(2))
        if r.status == "FINISHED" and r.sized(3).raw(1) == b"cancelled":
            return cls(r.integer(2), head=r.name(3))
        return cls(refusal=r.refusal())


@dataclass(frozen=True)
class ReserveReply:
    """``reserve``: 'OK' with the ``fence`` of the lease taken; else ``refusal``."""

    fence: int = 0
    refusal: Refusal | None = None

    @classmethod
    def parse(cls, reply: Any) -> ReserveReply:
        r = _Items("reserve", reply)
        if r.status == "OK":
            return cls(r.sized(1).integer(1))
        return cls(refusal=r.refusal())


@dataclass(frozen=True)
class RetryReply:
    """``retry``: 'OK' (queued again at ``position``, its ``retries`` now, its "retried"
    event ``event_id``), 'REPEATED' (a resend of that request: the turn is ``status`` now),
    both with the ``agent`` the record names (None: none); 'FULL' (``waiting`` turns fill
    the inbox), else ``refusal`` ('NOT_FAILED' with the turn's status among them)."""

    status: str
    position: int = -1
    retries: int = 0
    event_id: str = ""
    turn_status: str = ""
    waiting: int = 0
    refusal: Refusal | None = None
    agent: str | None = None

    @classmethod
    def parse(cls, reply: Any) -> RetryReply:
        r = _Items("retry", reply)
        if r.status == "OK":
            r.sized(4)
            return cls("OK", r.integer(1), r.integer(2), r.string(3), agent=r.name(4))
        if r.status == "REPEATED":
            r.sized(3)
            return cls("REPEATED", retries=r.integer(2), turn_status=r.string(1), agent=r.name(3))
        if r.status == "FULL":
            return cls("FULL", waiting=r.sized(1).integer(1))
        return cls(r.status, refusal=r.refusal())


@dataclass(frozen=True)
class CutOffReply:
    """``cut_off``: the run was counted as cut off ('OK', the turn's ``cut_offs`` now), or
    'SEEN' (``counted`` False: reported already, or nothing to give back); else
    ``refusal``."""

    counted: bool = False
    cut_offs: int = 0
    refusal: Refusal | None = None

    @classmethod
    def parse(cls, reply: Any) -> CutOffReply:
        r = _Items("cut_off", reply)
        if r.status == "OK":
            return cls(True, r.sized(1).integer(1))
        if r.status == "SEEN":
            r.sized(0)
            return cls()
        return cls(refusal=r.refusal())


@dataclass(frozen=True)
class RunningReply:
    """'OK' of ``renew`` or ``checkpoint`` (the turn runs on), with whether a cancel was
    requested for it; else ``refusal``."""

    cancel_requested: bool = False
    refusal: Refusal | None = None

    @classmethod
    def parse(cls, script: str, reply: Any) -> RunningReply:
        r = _Items(script, reply)
        if r.status == "OK":
            return cls(r.sized(1).flag(1))
        return cls(refusal=r.refusal())


@dataclass(frozen=True)
class Taken:
    """An 'OK' reply of ``take_head`` (lua/_lib.lua): a turn handed out under a lease.
    ``elements`` is None when its window was too long for one script call (read apart)."""

    fence: int
    fields: dict[str, bytes]
    state_kind: str | None
    state: bytes | None
    lead: Any
    elements: Any
    blobs: dict[str, bytes]
    next_turn_id: bytes | None
    window: int
    summarised: bool  # the conversation has a stored summary

    @classmethod
    def parse(cls, r: _Items) -> Taken:
        r.sized(10)
        kind = r.raw(3)
        return cls(
            fence=r.integer(1),
            fields=r.pairs(2),
            state_kind=None if kind is None else text(kind),
            state=r.raw(4) or None,
            lead=r.array(5),
            elements=r.array(6, optional=True),
            blobs=r.pairs(7),
            next_turn_id=r.raw(8) or None,
            window=r.integer(9),
            summarised=r.flag(10),
        )


@dataclass(frozen=True)
class TakeReply:
    """The reply of ``acquire``: ``status`` OK (``taken``), EMPTY, BUSY or RETRY (go on
    with ``head``); ``failed``: the turn this call failed on the way (over max attempts);
    ``refusal``: any other status, to turn into an error."""

    status: str
    taken: Taken | None = None
    head: bytes | None = None
    failed: str | None = None
    refusal: Refusal | None = None

    @classmethod
    def parse(cls, reply: Any) -> TakeReply:
        r = _Items("acquire", reply)
        if r.status == "OK":
            return cls(r.status, taken=Taken.parse(r))
        if r.status in ("EMPTY", "BUSY"):
            return cls(r.status, failed=_failed(r.sized(0, 1), 1))
        if r.status == "RETRY":
            return cls(r.status, head=r.sized(1, 2).raw(1), failed=_failed(r, 2))
        return cls(r.status, refusal=r.refusal())


def _failed(r: _Items, index: int) -> str | None:
    """The turn a script failed on the way (item ``index``), if it says one."""
    failed = r.raw(index)
    return text(failed) if failed else None


@dataclass(frozen=True)
class EndReply:
    """The 'OK' reply of ``commit`` or ``fail``: the turn queued next (None: the lease was
    freed), the turn failed on the way to it, and that turn handed out by the same call
    when it was the one expected (``taken``; ``take_refusal``: its take was refused).
    Another status: ``refusal`` (the ending itself was refused)."""

    next_turn_id: bytes | None = None
    failed: str | None = None
    taken: Taken | None = None
    take_refusal: Refusal | None = None
    refusal: Refusal | None = None

    @classmethod
    def parse(cls, script: str, reply: Any) -> EndReply:
        r = _Items(script, reply)
        if r.status != "OK":
            return cls(refusal=r.refusal())
        next_id, failed = r.sized(1, 3).raw(1) or None, _failed(r, 2)
        carried = r.array(3, optional=True)
        if carried is None:
            return cls(next_id, failed)
        inner = _Items(script, carried)
        if inner.status == "OK":
            return cls(next_id, failed, taken=Taken.parse(inner))
        return cls(next_id, failed, take_refusal=inner.refusal())


@dataclass(frozen=True)
class LoadReply:
    """``load``: 'OK' with the lead and window elements and the blobs they refer to
    (``elements`` None when the window was too long for one script call); else
    ``refusal`` ('VERSION' or 'CORRUPT')."""

    lead: Any = None
    elements: Any = None
    blobs: dict[str, bytes] = field(default_factory=dict)
    refusal: Refusal | None = None

    @classmethod
    def parse(cls, reply: Any) -> LoadReply:
        r = _Items("load", reply)
        if r.status != "OK":
            return cls(refusal=r.refusal())
        r.sized(3)
        return cls(r.array(1), r.array(2, optional=True), r.pairs(3))


@dataclass(frozen=True)
class AppendReply:
    """``append``: 'OK' (the turn was written; ``applied`` True) or 'APPLIED' (an append
    with that id was applied before: nothing written, ``applied`` False); else
    ``refusal`` ('STALE', 'VERSION' or 'CORRUPT')."""

    applied: bool
    refusal: Refusal | None = None

    @classmethod
    def parse(cls, reply: Any) -> AppendReply:
        r = _Items("append", reply)
        if r.status == "OK":
            r.sized(1).integer(1)
            return cls(True)
        if r.status == "APPLIED":
            r.sized(0)
            return cls(False)
        return cls(False, r.refusal())


@dataclass(frozen=True)
class WindowReply:
    """A reply of the ``window`` script. ``done``: the window is the element range
    ``first..last`` (empty when first > last), with the lead, elements and blob pairs when
    they came along (``inline``); else call again with ``resume`` (keep, then the walk's
    position). ``summary``: the stored summary's text, on the call that read it.
    ``refusal``: 'VERSION' or 'CORRUPT'."""

    done: bool
    summary: str | None = None
    first: int = 0
    last: int = -1
    inline: tuple[Any, Any, Any] | None = None
    resume: tuple[int, ...] = ()
    refusal: Refusal | None = None

    @classmethod
    def parse(cls, reply: Any) -> WindowReply:
        r = _Items("window", reply)
        if r.status == "DONE":
            summary = r.sized(3, 6).raw(3)
            found = None if summary is None else text(summary)
            # The lead, elements and blob pairs come along all three, or none of them.
            inline = None if len(reply) == 4 else (r.sized(6).array(4), r.array(5), r.array(6))
            return cls(True, found, r.integer(1), r.integer(2), inline)
        if r.status == "MORE":
            summary = r.sized(6).raw(6)
            moved = tuple(r.integer(i) for i in range(1, 5))
            found = None if summary is None else text(summary)
            return cls(False, found, resume=(r.integer(5), *moved))
        return cls(False, refusal=r.refusal())


@dataclass(frozen=True)
class SignalReply:
    """The ``signal`` script's reply: ``status`` DELIVERED (to ``call_id``; ``resume``:
    it was the turn's last missing decision, whose record names ``agent``), KEPT
    (``kept`` live ones now), SEEN (the inbox head is ``head``, '' for none, of ``agent``
    when the script read it), or RETRY (the inbox head is ``head``, '' for none); else
    ``refusal``."""

    status: str
    call_id: str = ""
    resume: bool = False
    kept: int = 0
    head: str = ""
    refusal: Refusal | None = None
    agent: str | None = None

    @classmethod
    def parse(cls, reply: Any) -> SignalReply:
        items = _Items("signal", reply)
        if items.status == "DELIVERED":
            resume = items.sized(2, 3).string(2) == "RESUME"
            if resume != (len(items.reply) == 4):
                raise malformed("signal", reply, "DELIVERED with an agent after RESUME only")
            agent = items.name(3) if resume else None
            return cls("DELIVERED", items.string(1), resume=resume, agent=agent)
        if items.status == "KEPT":
            return cls("KEPT", kept=items.sized(1).integer(1))
        if items.status == "SEEN":
            return cls("SEEN", head=items.sized(2).string(1), agent=items.name(2))
        if items.status == "RETRY":
            return cls("RETRY", head=items.sized(1).string(1))
        return cls(items.status, refusal=items.refusal())

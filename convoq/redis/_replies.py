"""Script replies as types, and the one table of refusals.

A Lua script answers with a list whose first item is a status. The replies of the scripts
that hand out turns (``acquire``, and ``commit``/``fail`` with their hand-off) are parsed
here into small records (:class:`Taken`, :class:`TakeReply`, :class:`EndReply`); no other
module reads them by position. A status that is not a success becomes an error through
:data:`REFUSALS` (or the stored-data errors ``VERSION``/``CORRUPT``), so each error has
one wording: :func:`stale_fence` is the only place a :class:`StaleFenceError` is worded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from convoq.errors import (
    ConversationBusyError,
    ConvoqError,
    CorruptDataError,
    NotInboxHeadError,
    ProtocolError,
    StaleFenceError,
    TurnAlreadyAppliedError,
    TurnCancelledError,
    UnknownTurnError,
    UnsupportedFormatVersionError,
)
from convoq.redis._codec import FORMAT_VERSION, pairs_to_dict, text
from convoq.redis.keys import KeySchema


def stored_data_error(
    code: str, reply: list[Any], keys: KeySchema, cid: str
) -> CorruptDataError | UnsupportedFormatVersionError | None:
    """The error for a 'VERSION' or 'CORRUPT' script reply, else None."""
    if code == "VERSION":
        return version_error(keys, cid, text(reply[1]))
    if code == "CORRUPT":
        key = text(reply[1])
        return CorruptDataError(
            f"stored data in {key} does not parse; restore it from a backup or clear the"
            " conversation",
            key=key,
        )
    return None


def version_error(keys: KeySchema, cid: str, found: str) -> UnsupportedFormatVersionError:
    return UnsupportedFormatVersionError(
        f"conversation {cid!r} is stored in format version {found!r} but this convoq reads"
        f" version {FORMAT_VERSION}; upgrade convoq, or export the conversation with the"
        " convoq that wrote it and import it here",
        key=keys.meta(cid),
        format_version=found,
    )


def stale_fence(cid: str, tid: str | None = None, fence: int | None = None) -> StaleFenceError:
    """The lease a write was fenced with moved on: nothing was written."""
    whose = f"turn {tid!r} of conversation {cid!r}" if tid else f"conversation {cid!r}"
    held = "" if fence is None else f" (fence {fence} is no longer current)"
    return StaleFenceError(
        f"the lease on {whose} moved on{held}; nothing was written: stop working on it,"
        " another writer holds the conversation now",
        conversation_id=cid,
        turn_id=tid,
        fence=fence,
    )


@dataclass(frozen=True)
class Refused:
    """Whom a refused script call was about, and what the script said."""

    cid: str
    tid: str | None  # None: a script of the whole conversation, whose error names no turn
    fence: int | None
    reply: list[Any]

    @property
    def where(self) -> str:
        if self.tid is None:
            return f"conversation {self.cid!r}"
        return f"turn {self.tid!r} of conversation {self.cid!r}"

    def arg(self, index: int) -> str:
        """Item ``index`` of the reply as text ('' when absent)."""
        return text(self.reply[index]) if len(self.reply) > index else ""

    @property
    def details(self) -> dict[str, Any]:
        if self.tid is None:
            return {"conversation_id": self.cid}
        return {"conversation_id": self.cid, "turn_id": self.tid}


def _protocol(message: Callable[[Refused], str]) -> Callable[[Refused], ConvoqError]:
    return lambda r: ProtocolError(message(r), code=text(r.reply[0]), **r.details)


REFUSALS: dict[str, Callable[[Refused], ConvoqError]] = {
    "STALE": lambda r: stale_fence(r.cid, r.tid, r.fence),
    "UNKNOWN": lambda r: UnknownTurnError(
        f"no {r.where}: it never existed or its record expired", **r.details
    ),
    "APPLIED": lambda r: TurnAlreadyAppliedError(
        f"{r.where} was already committed, failed or cancelled; nothing was written",
        **r.details,
    ),
    "NOT_HEAD": lambda r: NotInboxHeadError(
        f"{r.where} is not the turn being run (the inbox head); only the head can end",
        **r.details,
    ),
    "CANCELLED": lambda r: TurnCancelledError(
        f"{r.where} was cancelled while it ran; it ends cancelled, nothing is stored",
        **r.details,
    ),
    "BUSY": lambda r: ConversationBusyError(
        f"conversation {r.cid!r} has turns queued, running or awaiting approval; wait,"
        " cancel them, or pass force=True / if_busy='queue'",
        **r.details,
    ),
    "NOT_RUNNING": _protocol(lambda r: f"{r.where} is not running; acquire it first"),
    "NOT_PARKED": _protocol(lambda r: f"{r.where} is {r.arg(1)}, not awaiting approval"),
    "UNKNOWN_CALL": _protocol(
        lambda r: f"{r.where} has no pending tool call by that id; pending: {r.arg(1)}"
    ),
    "DECIDED": _protocol(lambda r: f"that tool call of {r.where} was already decided otherwise"),
    "EXPIRED": _protocol(lambda r: f"the approval for {r.where} expired; submit the turn again"),
}
"""Each refusal status of a script, and the error it becomes (one wording each)."""


def refusal_error(
    reply: list[Any], keys: KeySchema, cid: str, tid: str | None, fence: int | None = None
) -> ConvoqError:
    """The error for a script reply whose status is not a success."""
    code = text(reply[0])
    stored = stored_data_error(code, reply, keys, cid)
    if stored is not None:
        return stored
    refused = Refused(cid, tid, fence, reply)
    known = REFUSALS.get(code)
    if known is not None:
        return known(refused)
    return ProtocolError(
        f"{refused.where}: the script answered {code!r}", code=code, **refused.details
    )


def cancel_requested(reply: list[Any]) -> bool:
    """The flag of an 'OK' reply of renew or checkpoint: a cancel was requested."""
    return bool(reply[1] == b"1")


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

    @classmethod
    def parse(cls, reply: list[Any]) -> Taken:
        kind = text(reply[3]) if isinstance(reply[3], bytes) else None
        return cls(
            fence=int(reply[1]),
            fields=pairs_to_dict(reply[2]),
            state_kind=kind,
            state=reply[4] or None,
            lead=reply[5],
            elements=reply[6],
            blobs=pairs_to_dict(reply[7]),
            next_turn_id=reply[8] or None,
            window=int(reply[9]),
        )


def _failed(reply: list[Any], index: int) -> str | None:
    """The turn a script failed on the way (item ``index``), if it says one."""
    value = reply[index] if len(reply) > index else None
    return text(value) if value else None


@dataclass(frozen=True)
class TakeReply:
    """The reply of ``acquire``: ``status`` OK (``taken``), EMPTY, BUSY or RETRY (go on
    with ``head``); ``failed``: the turn this call failed on the way (over max attempts);
    ``refused``: any other status, the reply to turn into an error."""

    status: str
    taken: Taken | None = None
    head: bytes | None = None
    failed: str | None = None
    refused: list[Any] | None = None

    @classmethod
    def parse(cls, reply: list[Any]) -> TakeReply:
        status = text(reply[0])
        if status == "OK":
            return cls(status, taken=Taken.parse(reply))
        if status in ("EMPTY", "BUSY"):
            return cls(status, failed=_failed(reply, 1))
        if status == "RETRY":
            return cls(status, head=reply[1], failed=_failed(reply, 2))
        return cls(status, refused=reply)


@dataclass(frozen=True)
class EndReply:
    """The 'OK' reply of ``commit`` or ``fail``: the turn queued next (None: the lease was
    freed), the turn failed on the way to it, and that turn handed out by the same call
    when it was the one expected (``taken``; ``refused``: its take was refused)."""

    next_turn_id: bytes | None
    failed: str | None
    taken: Taken | None = None
    refused: list[Any] | None = None

    @classmethod
    def parse(cls, reply: list[Any]) -> EndReply:
        next_id, failed = reply[1] or None, _failed(reply, 2)
        carried = reply[3] if len(reply) > 3 else None
        if carried is None:
            return cls(next_id, failed)
        if text(carried[0]) == "OK":
            return cls(next_id, failed, taken=Taken.parse(carried))
        return cls(next_id, failed, refused=[text(carried[0]), *carried[1:]])


@dataclass(frozen=True)
class LoadReply:
    """The 'OK' reply of ``load``: the lead and window elements and the blobs they refer
    to; ``elements`` None when the window was too long for one script call."""

    lead: Any
    elements: Any
    blobs: dict[str, bytes]

    @classmethod
    def parse(cls, reply: list[Any]) -> LoadReply:
        return cls(reply[1], reply[2], pairs_to_dict(reply[3]))


@dataclass(frozen=True)
class WindowReply:
    """A reply of the ``window`` script (its statuses 'VERSION'/'CORRUPT' are refused
    before parsing). ``done``: the window is the element range ``first..last`` (empty when
    first > last), with the lead, elements and blob pairs when they came along
    (``inline``); else call again with ``resume`` (keep, then the walk's position).
    ``summary``: the stored summary's text, on the call that read it."""

    done: bool
    summary: str | None
    first: int = 0
    last: int = -1
    inline: tuple[Any, Any, Any] | None = None
    resume: tuple[int, ...] = ()

    @classmethod
    def parse(cls, reply: list[Any]) -> WindowReply:
        if text(reply[0]) == "DONE":
            summary = None if reply[3] is None else text(reply[3])
            inline = (reply[4], reply[5], reply[6]) if len(reply) > 4 else None
            return cls(True, summary, int(reply[1]), int(reply[2]), inline)
        summary = None if reply[6] is None else text(reply[6])
        moved = tuple(int(value) for value in reply[1:5])
        return cls(False, summary, resume=(int(reply[5]), *moved))

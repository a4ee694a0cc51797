"""The one table of refusals: how a script status that is not a success becomes an error.

A reply is parsed in :mod:`convoq.redis._replies`; a status that is no success of its
script comes out of it as a :class:`Refusal`, and :func:`refusal_error` turns that into
the error :data:`REFUSALS` words for it, so each error has one wording whichever verb
was refused: :func:`stale_fence` is the only place a :class:`StaleFenceError` is worded.
A reply of another shape than its script answers is :func:`malformed`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from convoq.errors import (
    ConversationBusyError,
    ConversationMemoryError,
    ConvoqError,
    CorruptDataError,
    MalformedReplyError,
    NotInboxHeadError,
    ProtocolError,
    SignalBacklogFullError,
    StaleFenceError,
    SummaryConflictError,
    TurnAlreadyAppliedError,
    TurnCancelledError,
    TurnNotRetryableError,
    UnknownTurnError,
    UnsupportedFormatVersionError,
)
from convoq.redis._codec import FORMAT_VERSION, text
from convoq.redis.keys import KeySchema

_WAITS = {
    "person": "a person's decision (approve or deny it)",
    "result": "its result (complete_call)",
    "signal": "a signal (send it with signal)",
    "child": "its child turn",
}


def malformed(script: str, reply: Any, wanted: str) -> MalformedReplyError:
    shown = repr(reply)[:200]
    return MalformedReplyError(
        f"the {script} script answered {shown}, not {wanted}: a reply this convoq cannot"
        " read; check that the server is Redis 6.2 or later and that no proxy between"
        " changes script replies",
        script=script,
        reply=shown,
    )


@dataclass(frozen=True)
class Refusal:
    """A reply whose status is not a success of its script, to become an error."""

    script: str
    code: str
    args: tuple[Any, ...] = ()


def version_error(keys: KeySchema, cid: str, found: str) -> UnsupportedFormatVersionError:
    return UnsupportedFormatVersionError(
        f"conversation {cid!r} is stored in format version {found!r} but this convoq reads"
        f" version {FORMAT_VERSION}; upgrade convoq, or export the conversation with the"
        " convoq that wrote it and import it here",
        key=keys.meta(cid),
        format_version=found,
    )


def corrupt_data(key: str) -> CorruptDataError:
    return CorruptDataError(
        f"stored data in {key} does not parse; restore it from a backup or clear the conversation",
        key=key,
    )


def cleared_while_read(cid: str) -> ConversationMemoryError:
    """A multi-step read found the history cleared under it every time it started over."""
    return ConversationMemoryError(
        f"the history of conversation {cid!r} kept being cleared while it was read; try again"
    )


def subject(cid: str, tid: str | None) -> str:
    """What an error is about: a turn of a conversation, or the conversation."""
    return f"turn {tid!r} of conversation {cid!r}" if tid else f"conversation {cid!r}"


def stale_fence(cid: str, tid: str | None = None, fence: int | None = None) -> StaleFenceError:
    """The lease a write was fenced with moved on: nothing was written."""
    held = "" if fence is None else f" (fence {fence} is no longer current)"
    return StaleFenceError(
        f"the lease on {subject(cid, tid)} moved on{held}; nothing was written: stop working on it,"
        " another writer holds the conversation now",
        conversation_id=cid,
        turn_id=tid,
        fence=fence,
    )


# What to do instead of retrying a turn that did not fail, by where it stands.
_INSTEAD_OF_RETRY = {
    "queued": "it is waiting in line already: wait for it",
    "running": "it is running already: wait for it",
    "awaiting_approval": "it waits for approval: approve or deny its tool calls",
    "succeeded": "it is stored: submit a new turn to ask again",
    "expired": "it is stored (its approval expired): submit a new turn to ask again",
    "waiting": "it waits for its sub-agent calls' child turns: wait for it",
    "cancelled": "submit it again as a new turn",
    "blocked": "a guardrail blocked it (its error says which and why): submit a new turn",
    "interrupted": "a newer message interrupted it and it is stored as far as it went:"
    " submit a new turn to ask again",
    "merged": "its message joined the turn named in merged_into: retry that one if it failed",
}


def not_retryable(where: str, status: str, details: dict[str, Any]) -> TurnNotRetryableError:
    """A retry of a turn that is ``status``, not failed: refused, nothing changed."""
    instead = _INSTEAD_OF_RETRY.get(status, "only a failed turn can be retried")
    return TurnNotRetryableError(
        f"{where} is {status}, not failed, and only a failed turn can be retried;"
        f" nothing was changed: {instead}",
        status=status,
        **details,
    )


@dataclass(frozen=True)
class Refused:
    """Whom a refused script call was about, and what the script said."""

    refusal: Refusal
    keys: KeySchema
    cid: str
    tid: str | None  # None: a script of the whole conversation, whose error names no turn
    fence: int | None

    @property
    def where(self) -> str:
        return subject(self.cid, self.tid)

    @property
    def said(self) -> str:
        """The item after the status as text ('' when absent)."""
        args = self.refusal.args
        return text(args[0]) if args and isinstance(args[0], (bytes, str)) else ""

    @property
    def named(self) -> str:
        """The item after the status, which this refusal must carry (a key, a version)."""
        said = self.said
        if not said:
            r = self.refusal
            raise malformed(r.script, [r.code, *r.args], f"{r.code} and what it is about")
        return said

    @property
    def details(self) -> dict[str, Any]:
        if self.tid is None:
            return {"conversation_id": self.cid}
        return {"conversation_id": self.cid, "turn_id": self.tid}


def _protocol(message: Callable[[Refused], str]) -> Callable[[Refused], ConvoqError]:
    return lambda r: ProtocolError(message(r), code=r.refusal.code, **r.details)


def _continuation(message: str) -> Callable[[Refused], ConvoqError]:
    return lambda r: ConvoqError(message, conversation_id=r.cid)


ANY = "*"

REFUSALS: dict[tuple[str, str], Callable[[Refused], ConvoqError]] = {
    (ANY, "VERSION"): lambda r: version_error(r.keys, r.cid, r.named),
    (ANY, "CORRUPT"): lambda r: corrupt_data(r.named),
    (ANY, "STALE"): lambda r: stale_fence(r.cid, r.tid, r.fence),
    (ANY, "UNKNOWN"): lambda r: UnknownTurnError(
        f"no {r.where}: it never existed or its record expired", **r.details
    ),
    (ANY, "APPLIED"): lambda r: TurnAlreadyAppliedError(
        f"{r.where} was already committed, failed or cancelled; nothing was written",
        **r.details,
    ),
    ("discard", "FINISHED"): lambda r: REFUSALS[(ANY, "APPLIED")](r),
    (ANY, "NOT_HEAD"): lambda r: NotInboxHeadError(
        f"{r.where} is not the turn being run (the inbox head); only the head can end",
        **r.details,
    ),
    ("renew", "ENDED"): lambda r: NotInboxHeadError(
        f"{r.where} is no longer running under this lease; its run has ended", **r.details
    ),
    (ANY, "CANCELLED"): lambda r: TurnCancelledError(
        f"{r.where} was cancelled while it ran; it ends cancelled, nothing is stored",
        **r.details,
    ),
    (ANY, "BUSY"): lambda r: ConversationBusyError(
        f"conversation {r.cid!r} has turns queued, running or awaiting approval; wait,"
        " cancel them, or pass force=True / if_busy='queue'",
        **r.details,
    ),
    ("prune", "BUSY"): lambda r: ConversationBusyError(
        f"conversation {r.cid!r} has a turn queued, running or parked; prune it once it is idle",
        **r.details,
    ),
    ("pop", "BUSY"): lambda r: ConversationBusyError(
        f"conversation {r.cid!r} has a turn queued, running or awaiting approval; pop its"
        " newest message once it is idle, or wait for it (wait_s / busy_timeout_s)",
        **r.details,
    ),
    ("reserve", "BUSY"): lambda r: ConversationBusyError(
        f"conversation {r.cid!r} has a turn queued, running or awaiting approval (in a"
        " worker or another process); wait for it, or use if_busy='wait'",
        **r.details,
    ),
    ("reserve", "SPENT"): _continuation(
        "this continuation was already resumed or discarded; start a new turn"
    ),
    ("reserve", "GONE"): _continuation(
        "this continuation's approval expired (or its conversation was cleared):"
        " nothing of its turn was stored; start the turn again"
    ),
    ("summarise", "CHANGED"): lambda r: SummaryConflictError(
        f"the history or the summary of conversation {r.cid!r} changed while it was being"
        " summarised; nothing was stored (compaction runs again later)",
        **r.details,
    ),
    ("retry", "NOT_FAILED"): lambda r: not_retryable(r.where, r.named, r.details),
    (ANY, "NOT_RUNNING"): _protocol(lambda r: f"{r.where} is not running; acquire it first"),
    (ANY, "NOT_PARKED"): _protocol(lambda r: f"{r.where} is {r.said}, not awaiting approval"),
    (ANY, "UNKNOWN_CALL"): _protocol(
        lambda r: f"{r.where} has no pending tool call by that id; pending: {r.said}"
    ),
    (ANY, "DECIDED"): _protocol(
        lambda r: f"that tool call of {r.where} was already decided otherwise"
    ),
    (ANY, "CHILD_CALL"): _protocol(
        lambda r: (
            f"that tool call of {r.where} is a sub-agent call: its child turn decides"
            " it when it ends, not a person; cancel the turn to stop it"
        )
    ),
    (ANY, "NOT_CHILD_CALL"): _protocol(
        lambda r: f"that tool call of {r.where} waits for a person's decision, not a child turn"
    ),
    (ANY, "WAITS_FOR"): _protocol(
        lambda r: (
            f"that tool call of {r.where} waits for {_WAITS.get(r.said, r.said)}, which"
            " alone decides it"
        )
    ),
    ("signal", "FULL"): lambda r: SignalBacklogFullError(
        f"conversation {r.cid!r} keeps {r.said} signals by that name already, none taken"
        " by a wait; nothing was kept (raise signal_max_kept, or let a turn wait for them)",
        **r.details,
    ),
    (ANY, "EXPIRED"): _protocol(
        lambda r: f"the approval for {r.where} expired; submit the turn again"
    ),
}
"""Each refusal status, and the error it becomes (one wording each): ``(ANY, code)`` for
whichever script answers it, ``(script, code)`` where one script's refusal reads its own."""


def refusal_error(
    refusal: Refusal, keys: KeySchema, cid: str, tid: str | None, fence: int | None = None
) -> ConvoqError:
    """The error for a script reply whose status is not a success."""
    refused = Refused(refusal, keys, cid, tid, fence)
    known = REFUSALS.get((refusal.script, refusal.code)) or REFUSALS.get((ANY, refusal.code))
    if known is not None:
        return known(refused)
    return ProtocolError(
        f"{refused.where}: the {refusal.script} script answered {refusal.code!r}",
        code=refusal.code,
        **refused.details,
    )

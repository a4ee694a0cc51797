"""Double texting: a message that arrives while its conversation is busy.

``submit`` with ``if_busy``:

- ``"interrupt"``: the inbox head is flagged; a running head stops at its next step
  boundary (the step it is in finishes and is journaled) and its finished steps are stored,
  under the final status "interrupted"; the new turn then runs with that history.
- ``"rollback"``: the head is cancelled as ``cancel`` would (nothing of it is stored).
- ``"merge"``: the turn joins the inbox tail when that is a turn submitted with "merge"
  under the same merge key (agent and options) that has not started: one turn answers
  them all. Its own record ends "merged", naming the turn that answers it.

Both stops act on the head alone: turns queued behind it were acknowledged and run, in
order, before the new one. A parked head (awaiting approval, or waiting for child turns)
ends cancelled at once, its pending calls never decided.

The script needs the keys of the head (or tail), which only a read can tell: the client
reads it, sends its keys and its id, and the script refuses with MOVED (nothing written)
when the inbox changed in between; the client reads again and resends (a bounded number
of times). So the check and every write are one atomic script call: a worker never takes a
turn half merged, and a head is stopped once. A resent submit (same turn id, or the same
idempotency key) finds the turn stored and changes nothing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, get_args

from convoq.errors import ConversationMemoryError, ConvoqError, TurnCancelledError
from convoq.ids import check_turn_id
from convoq.redis._codec import text

if TYPE_CHECKING:
    from convoq.redis._records import SubmitResult
    from convoq.redis._submitting import SubmittingMixin

IfBusy = Literal["queue", "reject", "interrupt", "rollback", "merge"]
IF_BUSY: tuple[str, ...] = get_args(IfBusy)
# How often a submit reads the inbox again when it changed between the read and the script.
_MOVED_RETRIES = 20


class StopFlags(NamedTuple):
    """What was asked of a turn from outside its run: ``cancel`` (its cancel flag), and a
    double-texting stop: ``mode`` ("interrupt" or "rollback") sent by turn ``by``."""

    cancel: bool
    mode: str | None
    by: str | None


class HeadMoved(Exception):
    """The inbox head or tail a double-texting submit read is not there any more."""


def check_busy_args(if_busy: object, merge_key: str | None) -> None:
    """``if_busy`` is one of :data:`IF_BUSY`; "merge" comes with its merge key."""
    if if_busy not in IF_BUSY:
        raise ConvoqError(f"if_busy must be one of {list(IF_BUSY)}, not {if_busy!r}")
    if if_busy == "merge" and not merge_key:
        raise ConvoqError("if_busy='merge' needs the merge key of the turn (merge_key_of())")


def merge_key_of(agent: str, options: dict[str, Any], ignored: str = "") -> str:
    """What two turns share to be merged: the agent and every option (metadata, callback,
    model settings, output type, window) but ``ignored`` (the trace context), hashed."""
    kept = {k: v for k, v in options.items() if k != ignored}
    canonical = json.dumps([agent, kept], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def stopped_error(mode: str, by: str) -> dict[str, Any]:
    """The error of a turn stopped by turn ``by``'s submit with if_busy ``mode`` and ended
    cancelled (rolled back, or parked when it came), as its record keeps it."""
    reason = "rolled_back" if mode == "rollback" else "interrupted"
    what = "rolled back" if mode == "rollback" else "interrupted while parked"
    error = TurnCancelledError(
        f"the turn was {what}: turn {by} was submitted with if_busy={mode!r}",
        reason=reason,
        by=by,
    )
    return error.to_data()


@dataclass(frozen=True)
class BusyCall:
    """A submit with a double-texting mode: what ``submit`` built, before the inbox read.
    ``keys``: KEYS up to the idempotency key; ``args``: ARGV[1 .. 7]."""

    cid: str
    turn_id: str
    agent: str
    mode: str
    keys: list[str]
    args: list[Any]
    queue: str | None
    kick: str | None
    queued_event: str


async def busy_submit(
    proto: SubmittingMixin, call: BusyCall, merge_key: str | None
) -> SubmitResult:
    """Run ``submit`` with the head (interrupt, rollback) or tail (merge) read just before;
    read again while the script answers MOVED. A head ended here is uncounted."""
    index = -1 if call.mode == "merge" else 0
    inbox = proto.keys.inbox(call.cid)
    for _ in range(_MOVED_RETRIES):
        raw = await proto.redis.lindex(inbox, index)
        seen = check_turn_id(text(raw)) if raw is not None else ""
        keys = [*call.keys, *(proto.keys.turn_keys(call.cid, seen) if seen else [])]
        keys += [call.queue] if call.queue is not None else []
        if call.mode == "merge":
            busy: list[Any] = [seen, merge_key, proto.limits.max_turn_bytes]
        else:
            busy = [seen, proto.json_arg(stopped_error(call.mode, call.turn_id), "error")]
        try:
            result = await proto.admitted_submit(
                call.cid, call.turn_id, call.agent, keys, call.args,
                kick=call.kick, queued_event=call.queued_event, busy=busy,
            )  # fmt: skip
        except HeadMoved:
            continue
        if result.stopped == "cancelled" and seen and proto.queue_limits.counted:
            await proto.unadmit_quietly(call.cid, seen)  # the head ended here
        return replace(result, head=seen or None)
    raise ConversationMemoryError(
        f"conversation {call.cid!r} kept changing while turn {call.turn_id} was submitted"
        f" with if_busy={call.mode!r}; nothing was queued: try again"
    )

"""The rolling summary on Redis (the ``summary`` hash: text, watermark, version): its
state for compaction and its fenced commit (``summarise.lua``), as steps."""

from __future__ import annotations

import hashlib

from convoq.messages import Message
from convoq.redis._codec import text
from convoq.redis._decoded import forget
from convoq.redis._history import _raise_stored_errors, chunked_steps
from convoq.redis._refusals import refusal_error
from convoq.redis._replies import Outcome
from convoq.redis.keys import KeySchema
from convoq.redis.scripts import Batch, ScriptCall, Steps
from convoq.summary import Summary, SummaryBasis


def state_steps(
    keys: KeySchema, cid: str
) -> Steps[tuple[list[Message], Summary | None, SummaryBasis]]:
    """The basis first (what the commit checks), then the summary and whole history: a
    change in between makes the commit refuse, never store a summary of other turns."""
    names = [keys.summary(cid), keys.meta(cid), keys.turns(cid)]
    replies = yield Batch(
        [
            ("HMGET", names[0], "text", "watermark", "version"),
            ("HGET", names[1], "turns"),
            ("LINDEX", names[2], -1),
        ],
        transaction=True,
    )
    _raise_stored_errors(replies, names)
    (raw_text, watermark, version), turns, last = replies
    summary = None
    if raw_text is not None:
        summary = Summary(text=text(raw_text), watermark=int(watermark), version=int(version))
    basis = SummaryBasis(
        turns=int(turns or 0),
        last=hashlib.sha1(last).hexdigest() if last is not None else "",
        version=summary.version if summary else 0,
    )
    messages = yield from chunked_steps(keys, cid, 0)
    return messages, summary, basis


def summary_steps(keys: KeySchema, cid: str) -> Steps[Summary | None]:
    """The stored summary alone (one read, whatever the history's length)."""
    key = keys.summary(cid)
    replies = yield Batch([("HMGET", key, "text", "watermark", "version")])
    _raise_stored_errors(replies, [key])
    raw_text, watermark, version = replies[0]
    if raw_text is None:
        return None
    return Summary(text=text(raw_text), watermark=int(watermark), version=int(version))


def counts_steps(keys: KeySchema, cid: str) -> Steps[int]:
    """Stored turns after the summary's watermark, from two counters (no history read)."""
    replies = yield Batch(
        [("HGET", keys.meta(cid), "turns"), ("HGET", keys.summary(cid), "watermark")],
        transaction=True,
    )
    _raise_stored_errors(replies, [keys.meta(cid), keys.summary(cid)])
    return max(0, int(replies[0] or 0) - int(replies[1] or 0))


def commit_steps(keys: KeySchema, cid: str, summary: Summary, basis: SummaryBasis) -> Steps[None]:
    """Store ``summary`` and its watermark in one fenced write.

    Raises:
        SummaryConflictError: the history or the previous summary changed since ``basis``.
    """
    args = [summary.text, summary.watermark, summary.version]
    args += [basis.turns, basis.last, basis.version]
    script_keys = [keys.meta(cid), keys.turns(cid), keys.summary(cid)]
    reply = Outcome.parse("summarise", (yield ScriptCall("summarise", script_keys, args)))
    if reply.refusal is not None:
        raise refusal_error(reply.refusal, keys, cid, None)
    # The turns it covers are read no more (a compaction prunes them next).
    forget(keys.base(cid))

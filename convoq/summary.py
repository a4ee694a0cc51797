"""A conversation's rolling summary: data only (the compaction that writes it is
:mod:`convoq.compaction`).

A summary covers the first ``watermark`` turns of the stored history; what is sent is the
leading system/developer messages, the summary (as a system message) and the turns after
the watermark. The full history stays stored. ``version`` counts the summaries written;
a new one is committed only if the history and the previous summary are still those it
was made from (:class:`SummaryBasis`), in one fenced write per backend.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, NonNegativeInt

from convoq.messages import Message, MessageList

SUMMARY_PREFIX = "Summary of the earlier conversation:\n"


class Summary(BaseModel):
    """The summary text (as sent, prefix included), the turns it covers, its version."""

    text: str
    watermark: NonNegativeInt
    version: NonNegativeInt

    def message(self) -> Message:
        return Message.system(self.text)

    @classmethod
    def of(cls, body: str, *, watermark: int, version: int) -> Summary:
        return cls(text=SUMMARY_PREFIX + body, watermark=watermark, version=version)


class SummaryBasis(BaseModel):
    """What a summary was made from: the stored turns, the last one's fingerprint, and
    the version of the summary it replaces (0: none)."""

    turns: NonNegativeInt
    last: str
    version: NonNegativeInt


def fingerprint(turn: list[Message]) -> str:
    """A stable fingerprint of a stored turn (empty history: ``""``)."""
    if not turn:
        return ""
    return hashlib.sha1(MessageList.dump_json(turn)).hexdigest()


def with_summary(
    lead: list[Message], turns: list[list[Message]], summary: Summary | None
) -> list[Message]:
    """What is sent of a history: lead, summary, then the turns after its watermark."""
    if summary is None:
        return lead + [m for turn in turns for m in turn]
    kept = turns[summary.watermark :]
    return [*lead, summary.message(), *(m for turn in kept for m in turn)]

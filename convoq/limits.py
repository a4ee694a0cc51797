"""Size limits on what is queued and stored, limits on how many turns may be queued, and
the errors that say a limit was hit.

The client checks them before anything is queued; the Redis protocol checks them again
before anything is written (a client may run other settings than the workers).
"""

from __future__ import annotations

from dataclasses import dataclass

from convoq import defaults
from convoq.errors import AttachmentError, InvalidMessageError
from convoq.settings import ConvoqSettings


@dataclass(frozen=True)
class Limits:
    """Bytes allowed per attachment and per turn."""

    max_attachment_bytes: int = defaults.MAX_ATTACHMENT_BYTES
    max_turn_bytes: int = defaults.MAX_TURN_BYTES


@dataclass(frozen=True)
class QueueLimits:
    """How many turns may wait: per conversation (its inbox, checked inside the ``submit``
    script), per agent profile and in all (counted deployment-wide, see
    :mod:`convoq.redis._submitting`). ``None`` or 0: no limit."""

    per_conversation: int | None = defaults.MAX_QUEUED_PER_CONVERSATION
    per_agent: int | None = defaults.MAX_QUEUED_PER_AGENT
    total: int | None = defaults.MAX_QUEUED_TOTAL
    retry_after_s: float = defaults.QUEUE_FULL_RETRY_AFTER_S

    @property
    def counted(self) -> bool:
        """Whether turns are counted deployment-wide (a per-agent or total limit is set)."""
        return bool(self.per_agent) or bool(self.total)


def queue_limits(settings: ConvoqSettings) -> QueueLimits:
    """The queued-turn limits ``settings`` set (``CONVOQ_MAX_QUEUED_*``)."""
    return QueueLimits(
        per_conversation=settings.max_queued_per_conversation,
        per_agent=settings.max_queued_per_agent,
        total=settings.max_queued_total,
    )


def attachment_too_large(size: int, limits: Limits, name: str = "an attachment") -> AttachmentError:
    """The error for one attachment over ``max_attachment_bytes``."""
    return AttachmentError(
        f"{name} of {size} bytes is over max_attachment_bytes={limits.max_attachment_bytes};"
        " send a smaller file or raise max_attachment_bytes",
        size=size,
        limit=limits.max_attachment_bytes,
    )


def turn_too_large(size: int, limits: Limits, what: str = "the turn") -> InvalidMessageError:
    """The error for a message or turn over ``max_turn_bytes``."""
    return InvalidMessageError(
        f"{what} takes {size} bytes, over max_turn_bytes={limits.max_turn_bytes};"
        " send fewer or smaller attachments or raise max_turn_bytes",
        rule="max_turn_bytes",
        size=size,
        limit=limits.max_turn_bytes,
    )

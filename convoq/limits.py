"""Size limits on what is queued and stored, and the errors that say a limit was hit.

The client checks them before anything is queued; the Redis protocol checks them again
before anything is written (a client may run other settings than the workers).
"""

from __future__ import annotations

from dataclasses import dataclass

from convoq import defaults
from convoq.errors import AttachmentError, InvalidMessageError


@dataclass(frozen=True)
class Limits:
    """Bytes allowed per attachment and per turn."""

    max_attachment_bytes: int = defaults.MAX_ATTACHMENT_BYTES
    max_turn_bytes: int = defaults.MAX_TURN_BYTES


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

"""convoq workers: the Celery app, queue routing, the drain loop, the sweeper, webhooks.

Start one with ``convoq worker`` (or ``celery -A convoq.worker.app:app worker``); agent
profiles come from ``CONVOQ_AGENTS=myapp.agents``. Importing this package loads only the
pure routing and signing code, so clients can use them without the worker's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from convoq.worker.routing import parse_partitions, partition_of, route
from convoq.worker.webhooks import SIGNATURE_HEADER, sign, verify_signature

if TYPE_CHECKING:
    from convoq.worker.app import ConvoqCelery, create_app


def __getattr__(name: str) -> Any:
    if name in ("ConvoqCelery", "create_app"):
        from convoq.worker import app  # lazy: the worker side only when asked

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SIGNATURE_HEADER",
    "ConvoqCelery",
    "create_app",
    "parse_partitions",
    "partition_of",
    "route",
    "sign",
    "verify_signature",
]

"""convoq workers: the Celery app, queue routing, the drain loop, the sweeper, webhooks.

Start one with ``convoq worker`` (or ``celery -A convoq.worker.app:app worker``); agent
profiles come from ``CONVOQ_AGENTS=myapp.agents``. Importing this package starts and
loads nothing: the app is built on first access. What the client must agree with lives in
:mod:`convoq.queue`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from convoq.worker.app import ConvoqCelery, create_app


def __getattr__(name: str) -> Any:
    if name in ("ConvoqCelery", "create_app"):
        from convoq.worker import app  # lazy: the worker side only when asked

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ConvoqCelery", "create_app"]

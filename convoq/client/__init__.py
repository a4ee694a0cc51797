"""Submit turns to convoq workers and follow them: :class:`Client` (blocking) and
:class:`AsyncClient`, :class:`TurnHandle` / :class:`AsyncTurnHandle`, :class:`TurnResult`,
and the :class:`Deployment` a client reaches (its Redis, its workers alive and dead).
"""

from convoq.client._deployment import Deployment
from convoq.client.aclient import AsyncClient
from convoq.client.client import Client
from convoq.client.handle import AsyncTurnHandle, TurnHandle, TurnResult
from convoq.queue.signing import SIGNATURE_HEADER, verify_signature
from convoq.redis._scheduling import ScheduledTurn

__all__ = [
    "SIGNATURE_HEADER",
    "AsyncClient",
    "AsyncTurnHandle",
    "Client",
    "Deployment",
    "ScheduledTurn",
    "TurnHandle",
    "TurnResult",
    "verify_signature",
]

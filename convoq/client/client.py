"""``Client``: the blocking twin of :class:`AsyncClient`.

Every method runs the AsyncClient's coroutine on convoq's one loop thread (see
:mod:`convoq.client._sync_methods`), so connections and ``on_done`` watchers live on that loop
for as long as the Client does, and a Client works from inside a running event loop too.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from convoq.client._renamed import renamed_keyword
from convoq.client._sync_methods import blocking, blocking_as, signature_of
from convoq.client.aclient import AsyncClient
from convoq.client.handle import TurnHandle
from convoq.settings import ConvoqSettings


class Client:
    """Queue turns for convoq workers and follow them (blocking). Arguments as
    :class:`AsyncClient`; each method is the AsyncClient's, run to the end."""

    @signature_of(AsyncClient.__init__)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._async = AsyncClient(*args, **kwargs)

    @property
    def async_client(self) -> AsyncClient:
        """The AsyncClient underneath (use it only on convoq's loop thread)."""
        return self._async

    @property
    def settings(self) -> ConvoqSettings:
        """The settings this client resolved (argument, else ``CONVOQ_*``, else default)."""
        return self._async.settings

    @property
    def redis_url(self) -> str:
        return self._async.redis_url

    @property
    def prefix(self) -> str:
        return self._async.prefix

    @property
    def partitions(self) -> int:
        return self._async.partitions

    # output_schema= (deprecated) is taken here, in the caller's thread, so the warning
    # points at the caller's line (renamed_keyword).
    submit = renamed_keyword("output_schema", "output_type")(
        blocking_as(AsyncClient.submit, TurnHandle)
    )
    approve = blocking(AsyncClient.approve)
    deny = blocking(AsyncClient.deny)
    complete_call = blocking(AsyncClient.complete_call)
    signal = blocking(AsyncClient.signal)
    discard = blocking(AsyncClient.discard)
    cancel = blocking(AsyncClient.cancel)
    scheduled = blocking(AsyncClient.scheduled)
    retry = blocking_as(AsyncClient.retry, TurnHandle)
    history = blocking(AsyncClient.history)
    usage = blocking(AsyncClient.usage)
    clear = blocking(AsyncClient.clear)
    registered_agents = blocking(AsyncClient.registered_agents)
    workers = blocking(AsyncClient.workers)
    deployment = blocking(AsyncClient.deployment)
    awaiting_approval = blocking(AsyncClient.awaiting_approval)
    ping = blocking(AsyncClient.ping)
    close = blocking(AsyncClient.aclose)
    _connect = blocking(AsyncClient.connect)

    def connect(self) -> Client:
        """Start the embedded Redis if needed and open connections now (``with`` does)."""
        self._connect()
        return self

    def handle(self, conversation_id: str, turn_id: str) -> TurnHandle:
        """A handle on a turn submitted anywhere."""
        return TurnHandle(self._async.handle(conversation_id, turn_id))

    def verify_webhook(self, header: str, body: bytes | str, tolerance_s: int = 300) -> bool:
        """Check a callback's signature with ``webhook_secret``."""
        return self._async.verify_webhook(header, body, tolerance_s)

    def __enter__(self) -> Client:
        return self.connect()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

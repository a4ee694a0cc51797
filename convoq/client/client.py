"""``Client``: the blocking twin of :class:`AsyncClient`.

Every method runs the AsyncClient's coroutine on convoq's one loop thread
(:func:`convoq._sync.run_sync`), so connections and ``on_done`` watchers live on that loop
for as long as the Client does, and a Client works from inside a running event loop too.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from types import TracebackType
from typing import Literal

from convoq._sync import run_sync
from convoq.client._base import DEFAULT_MAX_ATTACHMENT_BYTES, DEFAULT_MAX_TURN_BYTES
from convoq.client.aclient import AsyncClient, OnDone, TurnRef
from convoq.client.handle import TurnHandle
from convoq.messages import Message


class Client:
    """Queue turns for convoq workers and follow them (blocking). Arguments as
    :class:`AsyncClient`."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        broker_url: str | None = None,
        prefix: str = "convoq",
        partitions: int = 16,
        agents: Collection[str] | None = None,
        webhook_secret: str | None = None,
        max_attachment_bytes: int = DEFAULT_MAX_ATTACHMENT_BYTES,
        max_turn_bytes: int = DEFAULT_MAX_TURN_BYTES,
        home: Path | None = None,
    ) -> None:
        self._async = AsyncClient(
            redis_url,
            broker_url=broker_url,
            prefix=prefix,
            partitions=partitions,
            agents=agents,
            webhook_secret=webhook_secret,
            max_attachment_bytes=max_attachment_bytes,
            max_turn_bytes=max_turn_bytes,
            home=home,
        )

    @property
    def async_client(self) -> AsyncClient:
        """The AsyncClient underneath (use it only on convoq's loop thread)."""
        return self._async

    @property
    def redis_url(self) -> str:
        return self._async.redis_url

    def submit(
        self,
        conversation_id: str,
        message: str | Message,
        *,
        agent: str,
        idempotency_key: str | None = None,
        keep_last_turns: int | None = None,
        callback_url: str | None = None,
        on_done: OnDone | None = None,
        if_busy: Literal["queue", "reject"] = "queue",
    ) -> TurnHandle:
        """Queue a turn and return its handle at once; see :meth:`AsyncClient.submit`."""
        inner = run_sync(
            self._async.submit(
                conversation_id,
                message,
                agent=agent,
                idempotency_key=idempotency_key,
                keep_last_turns=keep_last_turns,
                callback_url=callback_url,
                on_done=on_done,
                if_busy=if_busy,
            )
        )
        return TurnHandle(inner)

    def handle(self, conversation_id: str, turn_id: str) -> TurnHandle:
        """A handle on a turn submitted anywhere."""
        return TurnHandle(self._async.handle(conversation_id, turn_id))

    def approve(self, turn: TurnRef, call_id: str) -> None:
        """Approve a parked tool call."""
        run_sync(self._async.approve(turn, call_id))

    def deny(self, turn: TurnRef, call_id: str, *, reason: str | None = None) -> None:
        """Deny a parked tool call."""
        run_sync(self._async.deny(turn, call_id, reason=reason))

    def discard(self, turn: TurnRef, *, reason: str = "discarded") -> None:
        """Drop a parked turn."""
        run_sync(self._async.discard(turn, reason=reason))

    def cancel(self, turn: TurnRef) -> Literal["cancelled", "stopping", "finished"]:
        """Cancel a queued or running turn."""
        return run_sync(self._async.cancel(turn))

    def history(self, conversation_id: str, *, last_turns: int | None = None) -> list[Message]:
        """The stored messages of a conversation."""
        return run_sync(self._async.history(conversation_id, last_turns=last_turns))

    def clear(self, conversation_id: str, *, force: bool = False) -> None:
        """Delete a conversation."""
        run_sync(self._async.clear(conversation_id, force=force))

    def registered_agents(self) -> frozenset[str]:
        """Profile names the running workers registered."""
        return run_sync(self._async.registered_agents())

    def verify_webhook(self, header: str, body: bytes | str, tolerance_s: int = 300) -> bool:
        """Check a callback's signature with ``webhook_secret``."""
        return self._async.verify_webhook(header, body, tolerance_s)

    def close(self) -> None:
        """Stop pending ``on_done`` watchers and close connections."""
        run_sync(self._async.aclose())

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

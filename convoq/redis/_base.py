"""What every part of :class:`~convoq.redis.protocol.TurnProtocol` shares: the client, the
scripts, the limits, and the mapping of script statuses to errors."""

from __future__ import annotations

import json
from typing import Any, Self

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from convoq.errors import (
    ConfigurationError,
    ConversationBusyError,
    ConvoqError,
    NotInboxHeadError,
    ProtocolError,
    StaleFenceError,
    TurnAlreadyAppliedError,
    UnknownTurnError,
)
from convoq.redis._codec import Limits, MiB
from convoq.redis._history import stored_data_error
from convoq.redis.keys import KeySchema
from convoq.redis.scripts import Scripts

DAY_S = 86_400


def connect(url: str, *, max_connections: int = 64) -> aioredis.Redis:
    """A client for ``url`` that reconnects and resends after a dropped connection (a
    Redis restart; every script is safe to replay) and, at ``max_connections`` calls in
    flight, waits for a free connection instead of failing."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=60,
        decode_responses=False,
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), retries=5),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
    )
    return aioredis.Redis.from_pool(pool)


class ProtocolBase:
    """Client, key schema, scripts and limits of a turn protocol."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: KeySchema,
        *,
        max_attachment_bytes: int = 20 * MiB,
        max_turn_bytes: int = 64 * MiB,
        turn_ttl_s: int = 7 * DAY_S,
        events_maxlen: int = 1000,
    ) -> None:
        if redis.connection_pool.connection_kwargs.get("decode_responses"):
            raise ConfigurationError(
                "the turn protocol needs a redis client with decode_responses=False"
                " (attachments are raw bytes)"
            )
        self.redis = redis
        self.keys = keys
        self.limits = Limits(max_attachment_bytes, max_turn_bytes)
        self.turn_ttl_ms = int(turn_ttl_s * 1000)
        self.events_maxlen = events_maxlen
        self.scripts = Scripts(redis)
        self._owns_client = False

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "convoq", **limits: Any) -> Self:
        """A protocol on its own client for ``url`` (closed by :meth:`close`)."""
        keys = KeySchema(prefix)  # checked before a client exists
        protocol = cls(connect(url), keys, **limits)
        protocol._owns_client = True
        return protocol

    async def close(self) -> None:
        """Close the client if this protocol opened it."""
        if self._owns_client:
            await self.redis.aclose()

    def refusal(
        self, reply: list[Any], cid: str, tid: str, fence: int | None = None
    ) -> ConvoqError:
        """The error for a script status that is not a success."""
        code = reply[0]
        stored = stored_data_error(code, reply, self.keys, cid)
        if stored is not None:
            return stored
        where = f"turn {tid!r} of conversation {cid!r}"
        details = {"conversation_id": cid, "turn_id": tid}
        if code == "UNKNOWN":
            return UnknownTurnError(
                f"no {where}: it never existed or its record expired", **details
            )
        if code == "APPLIED":
            return TurnAlreadyAppliedError(
                f"{where} was already committed, failed or cancelled; nothing was written",
                **details,
            )
        if code == "STALE":
            return StaleFenceError(
                f"the lease for {where} moved on (fence {fence} is no longer current); stop"
                " working on it: another worker runs it now",
                fence=fence,
                **details,
            )
        if code == "NOT_HEAD":
            return NotInboxHeadError(
                f"{where} is not the turn being run (the inbox head); only the head can end",
                **details,
            )
        if code == "BUSY":
            return ConversationBusyError(
                f"conversation {cid!r} has turns queued, running or awaiting approval; wait,"
                " cancel them, or pass force=True / if_busy='queue'",
                **details,
            )
        return ProtocolError(_other_refusal(code, reply, where), code=code, **details)

    def json_arg(self, value: Any, what: str) -> str:
        """``value`` as compact JSON, or a clear error if it is not JSON-safe."""
        try:
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise ConvoqError(
                f"{what} must be JSON-safe (str, numbers, lists, dicts): {exc}"
            ) from exc


def text(value: bytes | str) -> str:
    """A reply item as str (the protocol's client answers bytes)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _other_refusal(code: str, reply: list[Any], where: str) -> str:
    def arg(index: int) -> str:
        value = reply[index] if len(reply) > index else ""
        return value.decode() if isinstance(value, bytes) else str(value)

    messages = {
        "NOT_RUNNING": f"{where} is not running; acquire it first",
        "NOT_PARKED": f"{where} is {arg(1)}, not awaiting approval",
        "UNKNOWN_CALL": f"{where} has no pending tool call by that id; pending: {arg(1)}",
        "DECIDED": f"that tool call of {where} was already decided otherwise",
        "EXPIRED": f"the approval for {where} expired; submit the turn again",
    }
    return messages.get(code, f"{where}: the script answered {code!r}")


def max_attempts_error(max_attempts: int) -> dict[str, Any]:
    return {
        "type": "MaxAttemptsExceededError",
        "message": f"the turn was started {max_attempts} times and never finished (each run"
        " lost its worker or lease); look for a crash in the agent or its tools",
        "details": {"max_attempts": max_attempts},
    }


def approval_expired_error() -> dict[str, Any]:
    return {
        "type": "ApprovalExpiredError",
        "message": "the tool calls waiting for approval were not decided in time; submit the"
        " turn again",
        "details": {},
    }

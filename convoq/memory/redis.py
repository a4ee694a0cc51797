"""Conversation memory in Redis: the production store.

Each turn is one list element (``LRANGE -N -1`` loads a window), attachments are stored
once per conversation by sha256, leading system/developer messages sit in their own list.
Appending is O(size of the appended messages), never O(history). The layout is shared
with the turn protocol (:mod:`convoq.redis`), so workers and in-process agents can serve
the same conversations.
"""

from __future__ import annotations

import secrets
import threading
import weakref
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

from convoq._connection_bounds import ConnectionBounds
from convoq._sync import adrive, drive, run_sync
from convoq.context import Scheduler, ScheduleRequest
from convoq.errors import ConvoqError
from convoq.ids import check_conversation_id
from convoq.limits import Limits
from convoq.memory._loop_protocols import LoopProtocols
from convoq.memory._popping import Keep, check_pop, kept_in_place
from convoq.memory._redis_holds import LeaseHolds
from convoq.memory._reservations import now_ms
from convoq.memory.base import StoredConversationMemory
from convoq.messages import Message
from convoq.redis._budget import budget_steps
from convoq.redis._cluster import AsyncRedis
from convoq.redis._history import append_history, append_steps, load_steps
from convoq.redis._raw import json_steps
from convoq.redis._retention import touch_call
from convoq.redis._scheduling import store_scheduler
from convoq.redis._summary import commit_steps, counts_steps, state_steps, summary_steps
from convoq.redis._sync_client import BlockingScripts, connect_blocking
from convoq.redis.embedded import url_or_embedded
from convoq.redis.keys import KeySchema
from convoq.redis.protocol import TurnProtocol
from convoq.redis.roles import MemoryStore
from convoq.settings import ConvoqSettings
from convoq.summary import Summary, SummaryBasis
from convoq.window import Window

T = TypeVar("T")
# A spent mark outlives its continuation's expiry by this much (clocks of two hosts).
_SPENT_MARGIN_MS = 60_000


class RedisConversationMemory(StoredConversationMemory):
    """Memory backend on Redis.

    Args:
        url: ``redis://[[user]:password@]host:port/db``, ``rediss://...`` (TLS; add
            ``?ssl_ca_certs=/path/ca.pem`` for a private CA), ``unix://`` or
            ``redis+cluster://host:port[,host:port...]`` (a Redis Cluster; sync and async
            calls both use a cluster client) URL, as :func:`convoq.redis.connect` takes it.
            None: ``CONVOQ_REDIS_URL``, else the embedded redis-server under ``home``
            (started on first use). A URL that cannot work, or credentials Redis refuses,
            raise ConfigurationError on first use.
        prefix: prefix of every key (None: ``CONVOQ_PREFIX``, else ``"convoq"``).
        max_attachment_bytes: largest attachment accepted (AttachmentError above it).
        max_turn_bytes: largest append accepted (InvalidMessageError above it).
        client: a ready ``redis.asyncio.Redis`` or ``RedisCluster``
            (``decode_responses=False``) used as is, in the caller's event loop, instead
            of ``url``.
        home: directory of the embedded server (None: ``CONVOQ_HOME``, else ``.convoq``).
        lease_ms: the lease an in-process Agent's turn holds on its conversation, renewed
            every third of it (None: ``CONVOQ_LEASE_MS``, else 10 s).

    An :class:`~convoq.Agent` on this memory runs each turn under the conversation's
    lease, the one workers take: while a worker runs or queues a turn of the
    conversation the Agent is refused (or waits, with ``if_busy="wait"``), while the
    Agent's turn runs or awaits approval workers wait, and the turn is stored by a commit
    fenced with that lease. One writer per conversation, whichever API writes it.

    Settings resolve as everywhere in convoq: argument, else ``CONVOQ_*``, else default.

    Without ``client`` the memory owns its connections, so its sync and async methods may
    be mixed from any thread or loop: async calls run in the caller's event loop on a pool
    of that loop's own, opened on its first call there and closed when that loop shuts
    down (``asyncio.run``'s end) or when the memory is closed, whichever comes first; sync
    ``load`` and ``append`` do their I/O on the caller's thread with a sync pool, through
    the same steps as the async calls; other sync methods run on convoq's shared loop
    thread (its pool is one more loop's).
    """

    # The protocol's window read answers exactly the window (tests/redis/test_redis_memory.py
    # checks windows of any appends against the window rules).
    _reads_exact_windows = True

    def __init__(
        self,
        url: str | None = None,
        *,
        prefix: str | None = None,
        max_attachment_bytes: int | None = None,
        max_turn_bytes: int | None = None,
        client: AsyncRedis | None = None,
        home: str | Path | None = None,
        lease_ms: int | None = None,
        conversation_ttl_s: int | None = None,
    ) -> None:
        s = ConvoqSettings.resolve(
            lease_ms=lease_ms,
            redis_url=url,
            prefix=prefix,
            max_attachment_bytes=max_attachment_bytes,
            max_turn_bytes=max_turn_bytes,
            home=home,
            conversation_ttl_s=conversation_ttl_s,
        )
        self._settings = s
        self._keys = KeySchema(s.prefix)
        self._limits = Limits(s.max_attachment_bytes, s.max_turn_bytes)
        self._given: MemoryStore | None = TurnProtocol.from_settings(client, s) if client else None
        self._loops = LoopProtocols(s, partial(url_or_embedded, s.redis_url, s.home))
        # A memory dropped without close() must not leave sockets to the GC.
        weakref.finalize(self, self._loops.close_soon)
        self._blocking: BlockingScripts | None = None
        self._blocking_lock = threading.Lock()
        self._holds = LeaseHolds(s.lease_ms)

    async def _read(self, conversation_id: str, window: Window) -> list[Message]:
        return await self._run(lambda p: p.window(conversation_id, window))

    async def _write(self, conversation_id: str, messages: list[Message]) -> None:
        append_id = secrets.token_hex(16)

        async def append(p: MemoryStore) -> None:
            await append_history(
                p.scripts, p.keys, conversation_id, messages, p.limits, append_id=append_id
            )
            await p.touch(conversation_id, also=[p.keys.applied(conversation_id, append_id)])

        await self._run(append)

    async def aload_json(self, conversation_id: str, *, last_turns: int | None = None) -> bytes:
        """The stored JSON of the messages :meth:`aload` returns, passed through: only
        elements with attachments (their bytes go in as base64), or stored before their
        header counted messages, are decoded (see :mod:`convoq.redis._raw`)."""
        steps = json_steps(self._keys, _checked(conversation_id, last_turns), last_turns)
        stored = await self._run(lambda p: adrive(steps, p.scripts.perform))
        return stored.array()

    def load_json(self, conversation_id: str, *, last_turns: int | None = None) -> bytes:
        """Blocking :meth:`aload_json`, its I/O on the caller's thread."""
        scripts = self._blocking_scripts()
        if scripts is None:
            return run_sync(self.aload_json(conversation_id, last_turns=last_turns))
        steps = json_steps(self._keys, _checked(conversation_id, last_turns), last_turns)
        return drive(steps, scripts.perform).array()

    async def _read_sent(self, conversation_id: str, window: Window) -> list[Message]:
        return await self._read(conversation_id, window)  # the window script honours it

    async def _summary_state(
        self, conversation_id: str
    ) -> tuple[list[Message], Summary | None, SummaryBasis]:
        steps = state_steps(self._keys, conversation_id)
        return await self._run(lambda p: adrive(steps, p.scripts.perform))

    async def asummary(self, conversation_id: str) -> Summary | None:
        """The conversation's stored summary, if any (one read of it alone)."""
        steps = summary_steps(self._keys, check_conversation_id(conversation_id))
        return await self._run(lambda p: adrive(steps, p.scripts.perform))

    async def aunsummarised_turns(self, conversation_id: str) -> int:
        steps = counts_steps(self._keys, conversation_id)
        return await self._run(lambda p: adrive(steps, p.scripts.perform))

    async def _commit_summary(
        self, conversation_id: str, summary: Summary, basis: SummaryBasis
    ) -> None:
        steps = commit_steps(self._keys, conversation_id, summary, basis)
        await self._run(lambda p: adrive(steps, p.scripts.perform))

    async def _prune(self, conversation_id: str, keep_last_turns: int) -> int:
        return await self._run(lambda p: p.prune(conversation_id, keep_last_turns=keep_last_turns))

    async def apop_message(
        self, conversation_id: str, *, wait_s: float = 0.0, keep: Keep | None = None
    ) -> Message | None:
        """One ``pop`` script, O(1) in the history's length: it refuses while a turn holds
        the lease or is queued, and the pop asks again until ``wait_s`` has passed (see
        :mod:`convoq.redis._popping`, also for what happens to attachments)."""
        check_pop(conversation_id, wait_s, keep)
        kept = None if keep is None else partial(kept_in_place, keep)
        return await self._run(lambda p: p.pop(conversation_id, keep=kept, wait_s=wait_s))

    async def _erase(self, conversation_id: str) -> None:
        await self._run(lambda p: p.clear(conversation_id, force=True))

    async def _delete(self, conversation_id: str) -> None:
        """Remove every key; ConversationBusyError while the turn protocol has turns of
        this conversation queued or running."""
        await self._run(lambda p: p.clear(conversation_id))

    # In-process turns: the conversation's lease, as workers hold it (see the class doc).
    async def areserve(
        self,
        conversation_id: str,
        token: str,
        *,
        resume_until_ms: int | None = None,
        wait_s: float = 0.0,
    ) -> None:
        check_conversation_id(conversation_id)
        spent_ttl = None if resume_until_ms is None else _ttl_until(resume_until_ms)
        await self._run(
            lambda p: self._holds.take(
                p, conversation_id, token, spent_ttl_ms=spent_ttl, wait_s=wait_s
            )
        )

    async def apark(self, conversation_id: str, token: str, *, ttl_s: float) -> None:
        ttl_ms = max(1, int(ttl_s * 1000))
        await self._run(lambda p: self._holds.park(p, conversation_id, token, ttl_ms))

    async def acommit_turn(self, conversation_id: str, token: str, messages: list[Message]) -> None:
        async def commit(p: MemoryStore) -> None:
            await self._holds.commit(p, conversation_id, token, messages)
            # The turn's append id is its token: that key expires with the idle TTL too.
            await p.touch(conversation_id, also=[p.keys.applied(conversation_id, token)])

        await self._run(commit)

    async def arelease(
        self, conversation_id: str, token: str, *, spent_until_ms: int | None = None
    ) -> None:
        spent_ttl = None if spent_until_ms is None else _ttl_until(spent_until_ms)
        await self._run(lambda p: self._holds.release(p, conversation_id, token, spent_ttl))

    # Sync calls do their I/O on the caller's thread; clear (rare) hops to the bridge loop.
    def _read_blocking(self, conversation_id: str, window: Window) -> list[Message]:
        scripts = self._blocking_scripts()
        if scripts is None or (window.max_tokens is not None and not window.default_counter):
            return super()._read_blocking(conversation_id, window)
        if window.max_tokens is not None or window.with_summary:
            keep = window.keep_last_turns or 0
            steps = budget_steps(
                self._keys, conversation_id, window.max_tokens, keep, window.with_summary
            )
        else:
            steps = load_steps(self._keys, conversation_id, window.keep_last_turns)
        return window.apply(drive(steps, scripts.perform))

    def _write_blocking(self, conversation_id: str, messages: list[Message]) -> None:
        scripts = self._blocking_scripts()
        if scripts is None:
            super()._write_blocking(conversation_id, messages)
            return
        append_id = secrets.token_hex(16)
        steps = append_steps(
            self._keys, conversation_id, messages, self._limits, append_id=append_id
        )
        drive(steps, scripts.perform)
        ttl_s = self._settings.conversation_ttl_s
        if ttl_s is not None:
            applied = self._keys.applied(conversation_id, append_id)
            scripts.perform(touch_call(self._keys, conversation_id, int(ttl_s * 1000), [applied]))

    def _blocking_scripts(self) -> BlockingScripts | None:
        """The sync pool's scripts, opened on first use; None with a given async client."""
        if self._given is not None:
            return None
        if self._blocking is None:
            with self._blocking_lock:
                if self._blocking is None:
                    client = connect_blocking(
                        self._url_to_use(), bounds=ConnectionBounds.of(self._settings)
                    )
                    weakref.finalize(self, client.close)
                    self._blocking = BlockingScripts(
                        client, fast_paths_on=self._settings.fast_paths
                    )
        return self._blocking

    def _url_to_use(self) -> str:
        return self._loops.url()

    async def aclose(self) -> None:
        """Close the connection pools this memory opened (a given client is left alone);
        the memory stays usable (a later call opens new ones)."""
        if self._given is None:
            self._close_blocking()
            await self._loops.aclose()

    def close(self) -> None:
        if self._given is None:
            self._close_blocking()
            self._loops.close()

    def _close_blocking(self) -> None:
        with self._blocking_lock:
            scripts, self._blocking = self._blocking, None
        if scripts is not None:
            scripts.client.close()

    def timer_scheduler(self) -> Scheduler:
        """What ``ctx.schedule`` of an Agent on this memory stores its follow-up turns
        with: scheduled turns of this Redis, which its workers run when they are due."""

        async def schedule(request: ScheduleRequest) -> str:
            return await self._run(lambda p: store_scheduler(p)(request))

        return schedule

    async def _run(self, call: Callable[[MemoryStore], Awaitable[T]]) -> T:
        if self._given is not None:
            return await call(self._given)
        return await call(await self._loops.current())


def _checked(conversation_id: str, last_turns: int | None) -> str:
    """The id, once it and ``last_turns`` are fit to read with (as :meth:`aload` checks)."""
    if last_turns is not None and last_turns < 0:
        raise ConvoqError("last_turns must be >= 0 (None or 0 loads every turn)")
    return check_conversation_id(conversation_id)


def _ttl_until(until_ms: int) -> int:
    """How long a spent mark must live so its continuation cannot run again (ms)."""
    return max(until_ms - now_ms(), 0) + _SPENT_MARGIN_MS

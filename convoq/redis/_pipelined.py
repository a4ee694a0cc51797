"""Hot commands sent on kept pooled connections, without redis-py's per-call machinery.

A window load is a few plain reads (``HGET``, ``LRANGE``) in one MULTI/EXEC; a turn is a
few script calls. redis-py spends more Python per call than the whole round trip of such
a command (``Pipeline``'s command stack, per-argument packing, a task per bounded write,
a pool checkout with a condition variable, response callbacks); these commands need none
of it: the raw replies of the plain reads are already what its callbacks return, and an
``EVALSHA`` has no callback. So they are packed and sent here on a connection the reader
keeps from the client's own pool, and their replies read back in order. Anything else, a
cluster client, a script Redis does not know yet (NOSCRIPT), or a connection that fails
on the way goes through redis-py as before: it reconnects, retries and loads scripts.
Sending again after a failure is what redis-py's retry does too: reads are safe to send
twice and every write script is a no-op when replayed (see :mod:`convoq.redis.scripts`).

Error replies of a batch come back as ``ResponseError`` values in their place, as
``pipeline.execute(raise_on_error=False)`` gives them; a script's error is raised.

Replies are taken from hiredis's reader as it parses them when redis-py uses hiredis
(one ``read_response`` per reply costs more than a window's reads), else through
``read_response``.

A fenced shortcut: it leans on redis-py internals (``AbstractConnection._writer``,
``read_response(timeout=math.inf)``, the pool's ``get_connection``/``release``, the
hiredis parsers' ``_reader`` and ``read_from_socket``), checked
with redis-py 5.0 to 8.1 (:data:`CHECKED_WITH`). :func:`direct_for` and
:func:`enabled_for` are the only ways in, and answer "no" when ``CONVOQ_FAST_PATHS`` is
off (:func:`convoq.settings.fast_paths`) or the installed redis-py is outside
:data:`CHECKED_WITH` (:func:`convoq.settings.fast_path`): then redis-py sends everything.
Only what it means to catch makes it step aside: an argument it does not pack (:class:`Unpackable`),
NOSCRIPT, a connection that fails; any other error (a bug here) is raised, never turned
into a silent fallback. Each call is counted and timed in
``convoq_redis_direct_seconds``, each step aside in ``convoq_redis_direct_fallbacks_total``
(:mod:`convoq.observe.metrics`): redis-py's own instrumentation does not see these calls.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aioredis
from redis._parsers import hiredis as _hiredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError, ResponseError

from convoq.observe import metrics
from convoq.settings import fast_path

# hiredis's parsers, when redis-py uses them: their replies are read in one go here. A
# redis-py without these names: one read_response per reply.
_ASYNC_HIREDIS: Any = getattr(_hiredis, "_AsyncHiredisParser", None)
_SYNC_HIREDIS: Any = getattr(_hiredis, "_HiredisParser", None)
_NOT_ENOUGH_DATA: Any = getattr(_hiredis, "NOT_ENOUGH_DATA", None)

CHECKED_WITH = ("redis", ">=5.0,<8.2")
"""The redis-py releases this module was checked with: outside them it is off (and says
so once in the log), whatever ``CONVOQ_FAST_PATHS`` says."""

# Reads whose raw RESP2 reply equals what redis-py's response callback returns for them.
_PLAIN_READS = frozenset({"GET", "HGET", "HMGET", "LINDEX", "LLEN", "LRANGE"})
_MULTI, _EXEC = ("MULTI",), ("EXEC",)
# What AsyncDirect.script answers when redis-py should send the call instead.
FALLBACK = object()


class Unpackable(Exception):
    """An argument this module does not pack (a float, a memoryview...): redis-py's encoder
    decides (and refuses what it refuses) on the fallback path."""


def enabled_for(client: object, explicit: bool | None = None) -> bool:
    """Whether hot commands on ``client`` go direct: a plain (not cluster) redis-py client,
    with the fast paths on (``explicit``, else ``CONVOQ_FAST_PATHS``) and redis-py in a
    release of :data:`CHECKED_WITH`."""
    plain_client = isinstance(client, redis.Redis | aioredis.Redis)
    return plain_client and fast_path("redis direct", (CHECKED_WITH,), explicit)


def direct_for(client: object, explicit: bool | None = None) -> AsyncDirect | None:
    """The direct sender of an async client, or None when redis-py sends everything (see
    :func:`enabled_for`)."""
    if isinstance(client, aioredis.Redis) and enabled_for(client, explicit):
        return AsyncDirect(client)
    return None


def plain(commands: Sequence[tuple[Any, ...]]) -> bool:
    """Whether every command is a read this module may send itself."""
    return all(str(command[0]).upper() in _PLAIN_READS for command in commands)


def _framed(commands: Sequence[tuple[Any, ...]], transaction: bool) -> list[tuple[Any, ...]]:
    return [_MULTI, *commands, _EXEC] if transaction else list(commands)


def pack(commands: Sequence[tuple[Any, ...]]) -> bytes:
    """The RESP request of ``commands`` (str, bytes and int arguments): what redis-py's
    ``pack_commands`` writes for them, without its per-argument dispatch."""
    out: list[bytes] = []
    for command in commands:
        out.append(b"*%d\r\n" % len(command))
        for arg in command:
            kind = arg.__class__
            if kind is str:
                arg = arg.encode("utf-8")
            elif kind is int:
                arg = b"%d" % arg
            elif kind is not bytes:
                arg = _packed_arg(arg)
            out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


def _packed_arg(arg: Any) -> bytes:
    """An argument of a subclass of str, int or bytes (bool is refused), as bytes."""
    if isinstance(arg, str):
        return arg.encode("utf-8")
    if isinstance(arg, int) and not isinstance(arg, bool):
        return b"%d" % arg
    if isinstance(arg, bytes):
        return bytes(arg)
    raise Unpackable(f"only str, bytes and int arguments are packed here: {arg!r}")


def _replies(raw: list[Any], transaction: bool) -> list[Any]:
    """The commands' replies: EXEC's array in a transaction, else one each."""
    if not transaction:
        return raw
    executed = raw[-1]
    if isinstance(executed, ResponseError):  # EXECABORT: every command gets the error
        return [executed] * (len(raw) - 2)
    return list(executed)


# Connections a reader keeps between its calls (borrowed from the client's pool, which
# counts them as in use): taking one from the pool costs about as much as the reads. At
# most a quarter of the pool's, so a small pool is never held up by idle connections.
_KEEP = 4


class AsyncDirect:
    """Plain reads and script calls on one async client (see the module docstring)."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._pool = client.connection_pool
        self._idle: list[Any] = []
        self._keep = min(_KEEP, getattr(self._pool, "max_connections", 0) // 4)
        self._pid = os.getpid()

    async def read(
        self, commands: Sequence[tuple[Any, ...]], transaction: bool, *, kind: str = "read"
    ) -> list[Any] | None:
        """The replies of ``commands``, or None when the caller should send them through
        redis-py instead (an argument it must encode, or the connection failed; reading
        changed nothing). ``kind``: the metric's label."""
        sent = _framed(commands, transaction)
        packed = _packed_or_none(sent)
        if packed is None:
            return None
        started = time.perf_counter()
        connection = await self._take()
        try:
            # One bound (the connection's socket timeout) for the write and all the replies:
            # redis-py bounds each write with wait_for, which starts a task per call.
            async with asyncio.timeout(connection.socket_timeout):
                await _send(connection, packed)
                raw = await _replies_of(connection, len(sent))
        except (ConnectionError, OSError, redis.ConnectionError, redis.TimeoutError) as exc:
            await self._drop(connection)
            if isinstance(exc, TimeoutError | redis.TimeoutError):
                await self._drop_idle()
            metrics.redis_direct_fallback("connection")
            return None
        except BaseException:
            # Cancelled mid-read (or a bug): replies may still be on the wire, so this
            # connection must not serve anyone again.
            await self._drop(connection)
            raise
        if len(self._idle) < self._keep:
            self._idle.append(connection)
        else:
            await self._pool.release(connection)
        metrics.redis_direct_call(kind, time.perf_counter() - started)
        return _replies(raw, transaction)

    async def script(self, sha: str, keys: list[str], args: list[Any]) -> Any:
        """The reply of ``EVALSHA sha``, or :data:`FALLBACK` when redis-py should send it
        (Redis does not know the script yet, an argument it must encode, or the connection
        failed). A script's error reply is raised, as redis-py raises it."""
        command = ("EVALSHA", sha, len(keys), *keys, *args)
        return _script_reply(await self.read([command], transaction=False, kind="script"))

    async def _take(self) -> Any:
        if self._pid != os.getpid():  # a forked child: those are the parent's sockets
            self._idle, self._pid = [], os.getpid()
        if self._idle:
            return self._idle.pop()
        return await self._pool.get_connection()  # type: ignore[no-untyped-call]

    async def _drop(self, connection: Any) -> None:
        await connection.disconnect(nowait=True)
        await self._pool.release(connection)  # the pool connects it again when next used

    async def _drop_idle(self) -> None:
        """After a reply that did not come in time: the connections idle now (kept here,
        or in the pool) likely went the same way (a NAT that forgot them, a partition),
        so they are closed too, and the resend and the calls after it open new ones
        instead of finding each dead one by its own timeout (each would cost a lease
        renewal its turn)."""
        idle, self._idle = self._idle, []
        for connection in idle:
            await self._drop(connection)
        await self._pool.disconnect(inuse_connections=False)


async def _send(connection: Any, packed: bytes) -> None:
    writer = getattr(connection, "_writer", None)
    own = type(connection).send_packed_command is AbstractConnection.send_packed_command
    if writer is None or not connection.is_connected or not own:
        # Not connected yet (redis-py connects first), or a connection class that sends
        # its own way (instrumentation): redis-py's send, bounded by our timeout anyway.
        await connection.send_packed_command(packed, check_health=False)
        return
    writer.write(packed)
    await writer.drain()


async def _replies_of(connection: Any, count: int) -> list[Any]:
    """The next ``count`` replies on ``connection``, an error reply as a ResponseError in
    its place. With hiredis's parser, taken from its reader as they are parsed, reading the
    socket only when it has not enough (one ``read_response`` per reply, each with its own
    checks and timeout context, cost more than the reads of a window)."""
    parser: Any = getattr(connection, "_parser", None)
    reader = getattr(parser, "_reader", None)
    if type(parser) is not _ASYNC_HIREDIS or reader is None or _NOT_ENOUGH_DATA is None:
        return [await _reply(connection) for _ in range(count)]
    out: list[Any] = []
    while len(out) < count:
        reply = reader.gets()
        if reply is _NOT_ENOUGH_DATA:
            await parser.read_from_socket()  # raises ConnectionError at EOF
            continue
        if isinstance(reply, redis.ConnectionError):
            raise reply
        out.append(reply)
    return out


async def _reply(connection: Any) -> Any:
    try:
        # math.inf: no bound of its own (redis-py's way to say so); the batch has one.
        return await connection.read_response(timeout=math.inf)
    except ResponseError as exc:  # an error reply in its place, the next ones still follow
        return exc


def read(
    client: redis.Redis,
    commands: Sequence[tuple[Any, ...]],
    transaction: bool,
    *,
    kind: str = "read",
) -> list[Any] | None:
    """:meth:`AsyncDirect.read` on a sync client (the caller's thread does the I/O; a
    connection from the pool for each call, the pool being thread-safe)."""
    pool = client.connection_pool
    sent = _framed(commands, transaction)
    packed = _packed_or_none(sent)
    if packed is None:
        return None
    started = time.perf_counter()
    connection: Any = pool.get_connection()  # redis-py leaves the sync connection untyped
    try:
        connection.send_packed_command([packed], check_health=False)
        raw = _sync_replies_of(connection, len(sent))
    except (ConnectionError, OSError, redis.ConnectionError, redis.TimeoutError) as exc:
        connection.disconnect()
        if isinstance(exc, TimeoutError | redis.TimeoutError):
            pool.disconnect(inuse_connections=False)  # as AsyncDirect._drop_idle says why
        metrics.redis_direct_fallback("connection")
        return None
    except BaseException:
        connection.disconnect()
        raise
    finally:
        pool.release(connection)
    metrics.redis_direct_call(kind, time.perf_counter() - started)
    return _replies(raw, transaction)


def script(client: redis.Redis, sha: str, keys: list[str], args: list[Any]) -> Any:
    """:meth:`AsyncDirect.script` on a sync client."""
    command = ("EVALSHA", sha, len(keys), *keys, *args)
    return _script_reply(read(client, [command], transaction=False, kind="script"))


def _packed_or_none(sent: list[tuple[Any, ...]]) -> bytes | None:
    """:func:`pack`, or None (counted) when an argument is for redis-py to encode."""
    try:
        return pack(sent)
    except Unpackable:
        metrics.redis_direct_fallback("argument")
        return None


def _script_reply(replies: list[Any] | None) -> Any:
    """A script call's reply, FALLBACK, or its error raised (see AsyncDirect.script)."""
    if replies is None:
        return FALLBACK
    if isinstance(replies[0], NoScriptError):
        metrics.redis_direct_fallback("noscript")
        return FALLBACK
    if isinstance(replies[0], ResponseError):
        raise replies[0]
    return replies[0]


def _sync_replies_of(connection: Any, count: int) -> list[Any]:
    """:func:`_replies_of` on a sync connection."""
    parser: Any = getattr(connection, "_parser", None)
    reader = getattr(parser, "_reader", None)
    if type(parser) is not _SYNC_HIREDIS or reader is None or _NOT_ENOUGH_DATA is None:
        return [_sync_reply(connection) for _ in range(count)]
    out: list[Any] = []
    while len(out) < count:
        reply = reader.gets()
        if reply is _NOT_ENOUGH_DATA:
            parser.read_from_socket()  # raises ConnectionError at EOF
            continue
        if isinstance(reply, redis.ConnectionError):
            raise reply
        out.append(reply)
    return out


def _sync_reply(connection: Any) -> Any:
    try:
        return connection.read_response()
    except ResponseError as exc:
        return exc

"""The Lua scripts of the turn protocol, loaded from ``convoq/redis/lua/*.lua``.

Each file starts with its ``-- KEYS[i]`` / ``-- ARGV[i]`` signature. ``_lib.lua`` (shared
helpers) is prepended to every script when it is loaded, so each script is still one
self-contained ``EVAL`` body that works on Redis 6.2 (no functions, no flags). redis-py's
``register_script`` sends ``EVALSHA`` and reloads the body on ``NOSCRIPT``, so a Redis
restart or ``SCRIPT FLUSH`` is transparent.

What a multi-step read or write sends is written once, as a generator of requests
(:class:`ScriptCall`, :class:`Batch`) that receives their replies; :class:`Scripts`
performs them on an async client, :class:`convoq.redis._sync_client.BlockingScripts` on a sync
one (:func:`convoq._sync.adrive` / :func:`convoq._sync.drive`).

redis-py resends a script whose reply was lost (the connection dropped after Redis ran
it), so each write script is a no-op when replayed: ``submit`` (the turn record exists:
DUP), ``commit``/``fail`` (the turn is final: APPLIED), ``park`` (parked with this fence:
PARKED), ``checkpoint`` (this state is journaled already), ``append`` and ``pop`` (their
write id is recorded: APPLIED), ``admit``/``unadmit`` (a member is counted once),
``reserve`` (the lease is this holder's: its fence), ``schedule`` (the turn record
exists: DUP), ``fire`` (a fired timer is gone from the zset), ``cut_off`` (the run's fence is
reported already: SEEN), ``retry`` (the request's token is the last retry's: REPEATED),
``unreserve``, ``decide``,
``discard``, ``renew``, ``touch``, ``prune`` and ``clear`` (they set what is already
set, or keep what is already kept). ``cancel`` replayed
answers "finished" and changes nothing. ``acquire`` replayed answers BUSY: nothing is
written twice, but the turn then waits for its lease to expire before it runs.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, TypeAlias, TypeVar

from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from convoq.redis import _pipelined
from convoq.redis._cluster import AsyncRedis
from convoq.redis._durable import Acks, replicated

NAMES = (
    "acquire",
    "admit",
    "append",
    "cancel",
    "checkpoint",
    "clear",
    "commit",
    "cut_off",
    "decide",
    "discard",
    "fail",
    "fire",
    "load",
    "park",
    "pop",
    "prune",
    "release",
    "renew",
    "reserve",
    "retry",
    "schedule",
    "signal",
    "submit",
    "summarise",
    "transfer",
    "touch",
    "unadmit",
    "unreserve",
    "window",
)


@cache
def source(name: str) -> str:
    """The full body sent to Redis: the shared helpers, then the script file."""
    lua = resources.files("convoq.redis") / "lua"
    return (lua / "_lib.lua").read_text("utf-8") + (lua / f"{name}.lua").read_text("utf-8")


T = TypeVar("T")


@dataclass(frozen=True)
class ScriptCall:
    """Run script ``name``; the reply is a list whose first item is a str status."""

    name: str
    keys: list[str]
    args: list[Any]


@dataclass(frozen=True)
class Batch:
    """Commands sent in one pipeline (MULTI/EXEC with ``transaction``); the reply is the
    list of their replies, an error reply as a ``ResponseError`` value."""

    commands: list[tuple[Any, ...]]
    transaction: bool = False


Request: TypeAlias = ScriptCall | Batch
# A sans-I/O read or write: yields requests, receives replies, returns its result.
Steps: TypeAlias = Generator[Request, Any, T]


def with_status(reply: Any) -> list[Any]:
    """A script reply as a list whose status (first item) is a str."""
    result = list(reply)
    if result and isinstance(result[0], bytes):
        result[0] = result[0].decode()
    return result


class Scripts:
    """Every script registered on one client; ``await scripts.run(name, keys, args)``.

    ``fast_paths_on``: the entry point's resolved ``ConvoqSettings.fast_paths`` (None:
    ``CONVOQ_FAST_PATHS``, see :func:`convoq.settings.fast_paths`); off, redis-py sends
    every command (:mod:`convoq.redis._pipelined` is not used).
    """

    def __init__(self, client: AsyncRedis, *, fast_paths_on: bool | None = None) -> None:
        self.client = client
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(source(name)) for name in NAMES
        }
        # Hot calls skip redis-py's machinery, unless the fast paths are off (a cluster
        # client keeps it: it routes).
        self._direct = _pipelined.direct_for(client, fast_paths_on)

    async def run(self, name: str, keys: list[str], args: list[Any]) -> list[Any]:
        """Run script ``name``; its reply is always a list whose first item is a status."""
        script = self._scripts[name]
        if self._direct is not None:
            reply = await self._direct.script(script.sha, keys, args)
            if reply is not _pipelined.FALLBACK:
                return with_status(reply)
        return with_status(await script(keys=keys, args=args))

    async def run_acked(
        self, name: str, keys: list[str], args: list[Any], acks: Acks, probe: str
    ) -> list[Any]:
        """:meth:`run`, answered only once ``acks.replicas`` replicas have what the script
        wrote or found (``probe``: the conversation's probe key; see ``_durable.py``).

        Raises:
            NotDurableError: fewer replicas confirmed it in time (it stays applied on the
                primary; running it again is a no-op that waits again).
        """
        if not acks.enabled:
            return await self.run(name, keys, args)
        script = self._scripts[name]
        try:
            command = ("EVALSHA", script.sha, len(keys), *keys, *args)
            return with_status(await replicated(self.client, acks, probe, command))
        except NoScriptError:
            script.sha = await self.client.script_load(script.script)
            command = ("EVALSHA", script.sha, len(keys), *keys, *args)
            return with_status(await replicated(self.client, acks, probe, command))

    async def direct(self, commands: list[tuple[Any, ...]]) -> list[Any] | None:
        """The raw RESP2 replies of ``commands`` sent directly (no redis-py callbacks:
        the caller reads them raw), or None: send them through redis-py instead (a cluster
        client, or the connection failed; only for commands safe to send twice)."""
        if self._direct is None:
            return None
        return await self._direct.read(commands, transaction=False)

    async def perform(self, request: Request) -> Any:
        """The reply to one request of a step function."""
        if isinstance(request, ScriptCall):
            return await self.run(request.name, request.keys, request.args)
        if self._direct is not None and _pipelined.plain(request.commands):
            replies = await self._direct.read(request.commands, request.transaction)
            if replies is not None:
                return replies
        async with self.client.pipeline(transaction=request.transaction) as pipe:
            for command in request.commands:
                pipe.execute_command(*command)
            return await pipe.execute(raise_on_error=False)

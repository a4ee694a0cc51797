"""The Lua scripts of the turn protocol, loaded from ``convoq/redis/lua/*.lua``.

Each file starts with its ``-- KEYS[i]`` / ``-- ARGV[i]`` signature. ``_lib.lua`` (shared
helpers) is prepended to every script when it is loaded, so each script is still one
self-contained ``EVAL`` body that works on Redis 6.2 (no functions, no flags). redis-py's
``register_script`` sends ``EVALSHA`` and reloads the body on ``NOSCRIPT``, so a Redis
restart or ``SCRIPT FLUSH`` is transparent.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

NAMES = (
    "acquire",
    "append",
    "cancel",
    "checkpoint",
    "clear",
    "commit",
    "decide",
    "discard",
    "fail",
    "load",
    "park",
    "renew",
    "submit",
)


@cache
def source(name: str) -> str:
    """The full body sent to Redis: the shared helpers, then the script file."""
    lua = resources.files("convoq.redis") / "lua"
    return (lua / "_lib.lua").read_text("utf-8") + (lua / f"{name}.lua").read_text("utf-8")


class Scripts:
    """Every script registered on one client; ``await scripts.run(name, keys, args)``."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(source(name)) for name in NAMES
        }

    async def run(self, name: str, keys: list[str], args: list[Any]) -> list[Any]:
        """Run script ``name``; its reply is always a list whose first item is a status."""
        reply = await self._scripts[name](keys=keys, args=args)
        result = list(reply)
        if result and isinstance(result[0], bytes):
            result[0] = result[0].decode()
        return result

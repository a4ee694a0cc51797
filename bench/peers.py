"""What users would pick instead of convoq, run in the benchmark where they are installed
(``pip install -e '.[bench]'``, which ``make bench`` does):

- OpenAI Agents' ``RedisSession`` (``agents.extensions.memory.redis_session``),
- langchain-community's ``RedisChatMessageHistory``,
- a bare Celery task with a Redis result backend, awaited with ``.get()``,
- the task a user would write by hand: ``RedisSession`` last 10 turns + the model +
  ``add_items``, as a Celery task with a Redis result backend.

This module is also the Celery app of the peer workers
(``celery -A bench.peers:celery_app worker``); each reads its own server's URL from
``BENCH_REDIS_URL`` (broker, result backend and the sessions of the hand-built task).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from typing import Any

from celery import Celery

from convoq.queue.transport import broker_url_for

QUEUE = "bench.peers"


class RecreatedSession:
    """OpenAI Agents' ``RedisSession`` Redis commands, re-created for when the library is
    not installed: ``get_items`` is LRANGE (the last N items, or all) + json.loads per
    item; ``add_items`` is WATCH, TYPE x2, then MULTI: HSET, HSETNX, RPUSH, HSET, EXEC."""

    def __init__(self, session_id: str, *, redis_client: Any, key_prefix: str) -> None:
        self._redis = redis_client
        self._session = f"{key_prefix}:{session_id}"
        self._messages = f"{self._session}:messages"
        self._id = session_id

    async def get_items(self, limit: int | None = None) -> list[Any]:
        start = 0 if limit is None else -limit
        raw = await self._redis.lrange(self._messages, start, -1)
        return [json.loads(item.decode("utf-8")) for item in raw]

    async def add_items(self, items: list[Any]) -> None:
        serialized = [json.dumps(item, separators=(",", ":")) for item in items]
        now = str(int(time.time()))
        async with self._redis.pipeline(transaction=True) as pipe:
            await pipe.watch(self._session, self._messages)
            await pipe.type(self._session)
            await pipe.type(self._messages)
            pipe.multi()
            pipe.hset(self._session, "session_id", self._id)
            pipe.hsetnx(self._session, "created_at", now)
            pipe.rpush(self._messages, *serialized)
            pipe.hset(self._session, "updated_at", now)
            await pipe.execute()


def session_class() -> tuple[Any, str]:
    """OpenAI Agents' RedisSession and its label, or the re-creation when not installed."""
    try:
        from agents.extensions.memory.redis_session import RedisSession
    except ImportError:
        return RecreatedSession, "RedisSession (re-created: openai-agents not installed)"
    return RedisSession, "RedisSession"


_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def make_app(url: str) -> Celery:
    """The peers' Celery app: JSON, a Redis result backend, acks late like convoq."""
    app = Celery("bench-peers", set_as_current=False)
    app.conf.update(
        broker_url=broker_url_for(url),
        result_backend=broker_url_for(url),
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_default_queue=QUEUE,
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
    )
    return app


celery_app = make_app(_URL)


# The replies of the zero-latency models, by name; convoq's benchmark agents answer the same.
REPLIES = {"ok": "ok", "300": ("It depends on the weather and the trains. " * 8)[:300]}


def zero_model(history: list[dict[str, Any]], text: str, reply: str = "ok") -> str:
    """The zero-latency model of the peers: a plain function that answers at once."""
    return REPLIES[reply]


@celery_app.task(name="bench.bare")
def bare(text: str, reply: str = "ok") -> str:
    """The bare task: the model's answer as the task's result."""
    return zero_model([], text, reply)


_local = threading.local()


def _session_loop() -> tuple[asyncio.AbstractEventLoop, Any]:
    """One event loop and one async Redis client per worker thread, kept between tasks:
    what a careful hand-written task does (asyncio.run per task would be slower)."""
    if not hasattr(_local, "loop"):
        import redis.asyncio as aioredis

        _local.loop = asyncio.new_event_loop()
        _local.client = aioredis.Redis.from_url(_URL)
    return _local.loop, _local.client


HAND_PREFIX = "bench:hand"


@celery_app.task(name="bench.handbuilt")
def handbuilt(conversation_id: str, text: str, reply: str = "ok") -> str:
    """RedisSession's last 10 turns, the model, then ``add_items`` of the turn."""
    session_type, _ = session_class()
    loop, client = _session_loop()

    async def turn() -> str:
        session = session_type(conversation_id, redis_client=client, key_prefix=HAND_PREFIX)
        history = await session.get_items(limit=20)
        answer = zero_model(history, text, reply)
        await session.add_items(
            [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
        )
        return answer

    return loop.run_until_complete(turn())

"""What users would pick instead of convoq, run in the benchmark where they are installed
(``pip install -e '.[bench]'``, which ``make bench`` does):

- OpenAI Agents' ``RedisSession`` (``agents.extensions.memory.redis_session``),
- langchain-community's ``RedisChatMessageHistory``,
- a bare Celery task with a Redis result backend, awaited with ``.get()``,
- the task a user would write by hand: ``RedisSession`` last 10 turns + the model +
  ``add_items``, as a Celery task with a Redis result backend.

This module is also the Celery app of the peer worker
(``celery -A bench.peers:celery_app worker``); it reads ``BENCH_REDIS_URL``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from celery import Celery

from convoq.queue.transport import broker_url_for

QUEUE = "bench.peers"
_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def make_app(url: str) -> Celery:
    """The peers' Celery app: JSON, a Redis result backend, acks late like convoq."""
    app = Celery("bench-peers", set_as_current=False)
    app.conf.update(
        broker_url=broker_url_for(url),
        result_backend=url,
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


def zero_model(history: list[dict[str, Any]], text: str) -> str:
    """The same zero-latency model convoq's benchmark turns use: it answers at once."""
    return "ok"


@celery_app.task(name="bench.bare")
def bare(text: str) -> str:
    """The bare task: the model's answer as the task's result."""
    return zero_model([], text)


_local = threading.local()


def _session_loop() -> tuple[asyncio.AbstractEventLoop, Any]:
    """One event loop and one async Redis client per worker thread, kept between tasks:
    what a careful hand-written task does (asyncio.run per task would be slower)."""
    if not hasattr(_local, "loop"):
        import redis.asyncio as aioredis

        _local.loop = asyncio.new_event_loop()
        _local.client = aioredis.Redis.from_url(_URL)
    return _local.loop, _local.client


@celery_app.task(name="bench.handbuilt")
def handbuilt(conversation_id: str, text: str) -> str:
    """RedisSession's last 10 turns, the model, then ``add_items`` of the turn."""
    from agents.extensions.memory.redis_session import RedisSession

    loop, client = _session_loop()

    async def turn() -> str:
        session = RedisSession(conversation_id, redis_client=client, key_prefix="bench:hand")
        history = await session.get_items(limit=20)
        answer = zero_model(history, text)
        await session.add_items(
            [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
        )
        return answer

    return loop.run_until_complete(turn())

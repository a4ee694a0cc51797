"""Agent profiles of the direct-kick tests (``CONVOQ_AGENTS=tests.support.direct_agents``),
and a record of the tasks Celery's pool ran: each ``task_prerun`` appends the task's name
to the Redis list :func:`pool_tasks_key` names."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import redis
from celery import signals

from convoq import Agent
from convoq.models import ModelRequest, ScriptedModel


def pool_tasks_key(prefix: str) -> str:
    return f"{prefix}:test:pool-tasks"


async def _at_once(_request: ModelRequest) -> str:
    return "ok"


async def _a_while(_request: ModelRequest) -> str:
    await asyncio.sleep(0.5)
    return "done"


quick = Agent(ScriptedModel(_at_once, name="quick"), name="quick")
slow = Agent(ScriptedModel(_a_while, name="slow"), name="slow")


@signals.task_prerun.connect
def _ran_by_the_pool(task: Any = None, **_: Any) -> None:
    with redis.Redis.from_url(os.environ["CONVOQ_REDIS_URL"]) as r:
        r.rpush(pool_tasks_key(os.environ["CONVOQ_PREFIX"]), str(getattr(task, "name", task)))

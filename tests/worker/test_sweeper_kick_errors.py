"""One kick that raises does not end the sweeper's pass: the others in it are still kicked,
the failure is logged and counted (``convoq_sweeper_kick_errors_total``), and the next pass
kicks that conversation again.

The failure is a real one, through the worker's own Celery app and kicks on the test
Redis as broker: one partition's queue is a key of the wrong type, so kombu's ``LPUSH`` of
that conversation's kick is refused (``WRONGTYPE``) while the other queues take theirs."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from prometheus_client import REGISTRY

from convoq.messages import Message
from convoq.queue import routing
from convoq.settings import ConvoqSettings
from convoq.worker._kicks import Kicks
from convoq.worker.app import create_app
from convoq.worker.sweeper import Sweeper
from tests.support.protocol_helpers import open_protocol

PARTITIONS = 8


def _errors() -> float:
    return REGISTRY.get_sample_value("convoq_sweeper_kick_errors_total") or 0.0


def _on_distinct_partitions(prefix: str, count: int) -> list[str]:
    """``count`` conversation ids whose kicks go to ``count`` different queues."""
    found: dict[str, str] = {}
    while len(found) < count:
        cid = f"stranded-{uuid.uuid4().hex[:8]}"
        found.setdefault(routing.route(cid, prefix=prefix, partitions=PARTITIONS), cid)
    return list(found.values())


@pytest.fixture
def settings(redis_url: str, key_prefix: str) -> ConvoqSettings:
    return ConvoqSettings.resolve(redis_url=redis_url, prefix=key_prefix, partitions=PARTITIONS)


@pytest.fixture
def app(settings: ConvoqSettings) -> Iterator[Celery]:
    worker_app = create_app(settings)  # the worker's own Celery app and broker
    yield worker_app
    worker_app.close()


def _queue(settings: ConvoqSettings, cid: str) -> str:
    return routing.route(cid, prefix=settings.prefix, partitions=settings.partitions)


async def test_a_kick_that_raises_is_counted_and_the_pass_goes_on(
    app: Celery,
    settings: ConvoqSettings,
    r: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="convoq.sweeper")
    first, refused, last = cids = _on_distinct_partitions(settings.prefix, 3)
    async with open_protocol(settings.redis_url or "", settings.prefix) as proto:
        for cid in cids:  # queued with no kick and no lease: stranded
            await proto.submit(cid, uuid.uuid4().hex, agent="echo", message=Message.user("hi"),
                               options={})  # fmt: skip
        r.set(_queue(settings, refused), "not a list")  # the broker refuses pushes onto it
        sweeper = Sweeper(proto, Kicks(app, settings).kick, interval_s=60)
        before = _errors()
        kicked = await sweeper.sweep_once()
        assert sorted(kicked) == sorted([first, last])
        assert _errors() == before + 1
        assert f"sweeper could not kick {refused}" in caplog.text and "WRONGTYPE" in caplog.text
        for cid in (first, last):
            assert r.llen(_queue(settings, cid)) == 1  # the drain kick waits in its queue
        # Once the broker takes it again, the next pass kicks the one that failed.
        r.delete(_queue(settings, refused))
        assert refused in await sweeper.sweep_once()
        assert r.llen(_queue(settings, refused)) == 1
        assert _errors() == before + 1
        for cid in cids:
            await proto.clear(cid, force=True)
    for cid in cids:
        r.delete(_queue(settings, cid))

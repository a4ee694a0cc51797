"""The gateway tests' shared fixtures (each module defines ``pool = module_pool(...)``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.support.workers import WorkerPool


@pytest.fixture
def r(pool: WorkerPool) -> Iterator[redis.Redis]:
    """A plain client of the Redis the module's workers use."""
    client = redis.Redis.from_url(pool.redis_url)
    yield client
    client.close()

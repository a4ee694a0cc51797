from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from convoq.client import Client
from convoq.memory import ConversationMemory
from convoq.redis import TurnProtocol
from convoq.settings import fast_paths
from tests.support import services
from tests.support.clock import TestClock, install_clock
from tests.support.memory_backends import BACKENDS, backend_url, close_memory, make_memory
from tests.support.protocol_helpers import open_protocol
from tests.support.redis_cluster import RedisClusterNodes, plain_client
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerPool

# pytest-xdist's workers inherit COLUMNS=80 and LINES=24 from execnet; a Console made at
# import then keeps 80 columns for every test of that process, whatever width a test asks
# for. Forget them, as a plain pytest run has none.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``CONVOQ_FAST_PATHS`` off (``make test-slowpaths``) the behaviour tests run on
    redis-py, ``send_task`` and the broker; tests of a shortcut itself have nothing to
    test then."""
    if fast_paths():
        return
    skip = pytest.mark.skip(reason="a test of a fast path; CONVOQ_FAST_PATHS is off")
    for item in items:
        if item.get_closest_marker("fast_paths"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One private redis-server for the whole session (AOF on, free loopback port)."""
    server = RedisServer(Path(tmp_path_factory.mktemp("redis")))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    """One private Redis Cluster for the session: 3 primaries, 3 replicas, loopback ports."""
    cli = services.redis_cli()
    nodes = RedisClusterNodes(Path(tmp_path_factory.mktemp("cluster")), cli)
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture(params=["redis", "redis-cluster"])
def store_url(request: pytest.FixtureRequest) -> str:
    """A test asking for it runs on one redis-server and again on the Redis Cluster."""
    name = "redis_server" if request.param == "redis" else "redis_cluster"
    return str(request.getfixturevalue(name).url)


@pytest.fixture
def store_client(store_url: str) -> Iterator[redis.Redis]:
    """A plain client of ``store_url`` (a cluster client on the cluster)."""
    client = plain_client(store_url)
    yield client
    client.close()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def key_prefix() -> str:
    """A random key prefix per test: tests share one server but never each other's keys."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=BACKENDS)
def memory(
    request: pytest.FixtureRequest, tmp_path: Path, key_prefix: str
) -> Iterator[ConversationMemory]:
    """A fresh memory of each backend: in process, files, a redis-server, a Redis Cluster
    (closed after the test)."""
    made = make_memory(request.param, tmp_path, backend_url(request, request.param), key_prefix)
    yield made
    close_memory(made)


@pytest.fixture
def protocol_url(redis_url: str) -> str:
    """Where ``proto`` connects: the session's redis-server (a module whose tests run on
    the Redis Cluster too overrides it with ``store_url``)."""
    return redis_url


@pytest.fixture
async def proto(protocol_url: str, key_prefix: str) -> AsyncIterator[TurnProtocol]:
    """A turn protocol on ``protocol_url`` under the test's key prefix, closed after it."""
    async with open_protocol(protocol_url, key_prefix) as protocol:
        yield protocol


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def r(redis_client: redis.Redis) -> redis.Redis:
    """``redis_client`` under the short name the worker and gateway tests use."""
    return redis_client


@pytest.fixture(scope="module")
def client(pool: WorkerPool) -> Iterator[Client]:
    """A Client of the module's worker pool (the module defines ``pool``, e.g. with
    :func:`tests.support.workers.module_pool`); a module with a client of its own
    defines ``client`` itself."""
    with pool.client() as c:
        yield c


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> TestClock:
    """A clock the test moves forward, read by convoq's in-process expiries."""
    return install_clock(monkeypatch)

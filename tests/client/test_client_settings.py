"""One resolution order everywhere: explicit argument, else ``CONVOQ_*``, else the default.
A client started in the workers' environment reaches the workers, and one that disagrees
with them is told so before anything is queued."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from convoq.client import AsyncClient, Client
from convoq.errors import ConfigurationError
from convoq.memory import RedisConversationMemory
from convoq.messages import Message
from convoq.redis.keys import KeySchema
from convoq.settings import ConvoqSettings
from tests.support.workers import WorkerPool, module_pool

pool = module_pool(1, partitions=3)


@pytest.fixture
def workers_env(pool: WorkerPool, monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkerPool]:
    """This process's environment set as the workers' is (CONVOQ_* only)."""
    for name, value in pool.env.items():
        if name.startswith("CONVOQ_"):
            monkeypatch.setenv(name, value)
    yield pool


@pytest.mark.slow
def test_a_client_in_the_workers_environment_reaches_them(
    workers_env: WorkerPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # an embedded server would start under ./.convoq here
    with Client() as client:
        assert client.redis_url == workers_env.redis_url
        assert (client.prefix, client.partitions) == (workers_env.prefix, 3)
        result = client.submit("env-1", "hello", agent="echo").wait(timeout=30)
    assert result.status == "succeeded"
    assert not (tmp_path / ".convoq").exists()


def test_memory_reads_the_same_settings(workers_env: WorkerPool, redis_client: redis.Redis) -> None:
    memory = RedisConversationMemory()
    try:
        memory.append("env-mem", [Message.user("hi"), Message.assistant("hello")])
        keys = KeySchema(workers_env.prefix)
        assert redis_client.llen(keys.turns("env-mem")) == 1
    finally:
        memory.close()


def test_an_explicit_argument_beats_the_environment(
    workers_env: WorkerPool, key_prefix: str
) -> None:
    client = AsyncClient(prefix=key_prefix, partitions=7)
    assert (client.prefix, client.partitions) == (key_prefix, 7)
    assert client.redis_url == workers_env.redis_url  # not given: from CONVOQ_REDIS_URL


def test_a_bad_setting_in_the_environment_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVOQ_PARTITIONS", "zero")
    with pytest.raises(ConfigurationError, match="CONVOQ_PARTITIONS"):
        AsyncClient()
    with pytest.raises(ConfigurationError, match="CONVOQ_PARTITIONS"):
        ConvoqSettings.resolve()


def test_constructing_a_client_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("CONVOQ_REDIS_URL", "CONVOQ_HOME"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    AsyncClient(home=home)
    Client(home=home).close()
    assert not home.exists()  # the embedded server starts on first use, not here


@pytest.mark.slow
def test_a_partition_count_the_workers_do_not_use_is_refused(
    workers_env: WorkerPool, redis_client: redis.Redis
) -> None:
    with Client(partitions=5) as client, pytest.raises(ConfigurationError, match=r"\[3\]"):
        client.submit("env-2", "hello", agent="echo")
    assert redis_client.llen(KeySchema(workers_env.prefix).inbox("env-2")) == 0


@pytest.mark.slow
def test_a_prefix_no_worker_runs_under_is_reported(
    workers_env: WorkerPool, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "convoq.client"), Client(prefix=key_prefix) as client:
        client.submit("env-3", "hello", agent="echo")
    assert f"no convoq worker is registered under prefix {key_prefix!r}" in caplog.text
    assert workers_env.prefix in caplog.text


def test_resolved_settings_are_taken_as_they_are(key_prefix: str) -> None:
    settings = ConvoqSettings.resolve(prefix=key_prefix, partitions=5, min_replicas_acked=1)
    client = AsyncClient(settings=settings)
    assert client.settings is settings
    assert (client.prefix, client.partitions) == (key_prefix, 5)
    with pytest.raises(ConfigurationError, match=r"either settings= or \['prefix'\]"):
        AsyncClient(prefix="other", settings=settings)

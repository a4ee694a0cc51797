"""A client whose Redis no worker ever registered on says so, naming that Redis: once at
submit (a logged warning), in the message of a wait that ran out, and in its deployment.
The case behind it: no CONVOQ_REDIS_URL, and a client started in another directory, so
on another (empty) embedded Redis."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from convoq.client import Client
from convoq.errors import TurnTimeoutError
from convoq.redis import embedded
from tests.support.redis_server import RedisServer
from tests.support.workers import running_pool, wait_until

NEVER = "no convoq worker has ever registered on"


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory of its own, with no Redis configured: the embedded Redis's home."""
    for name in ("CONVOQ_REDIS_URL", "CONVOQ_BROKER_URL", "CONVOQ_HOME", "CONVOQ_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / ".convoq"
    yield home
    embedded.stop(home)


def test_a_client_on_an_empty_embedded_redis_says_no_worker_ever_registered(
    elsewhere: Path, caplog: pytest.LogCaptureFixture
) -> None:
    where = f"the embedded Redis under {elsewhere.resolve()}"
    with caplog.at_level(logging.WARNING, "convoq.client"), Client(home=elsewhere) as client:
        first = client.submit("c1", "hello?", agent="assistant")
        client.submit("c1", "anyone?", agent="assistant")
        warned = [r.getMessage() for r in caplog.records if NEVER in r.getMessage()]
        assert len(warned) == 1, caplog.text  # once per client
        assert where in warned[0] and "agent names cannot be checked" in warned[0]
        with pytest.raises(TurnTimeoutError) as ran_out:
            first.wait(0.3)
        assert NEVER in ran_out.value.message and where in ran_out.value.message
        with pytest.raises(TurnTimeoutError) as no_done:  # convoq watch reads events
            list(first.events(timeout=0.3))
        assert NEVER in no_done.value.message and where in no_done.value.message
        found = client.deployment()
        assert found.redis.startswith(where) and not found.ever_registered and found.workers == {}
        assert found.problem() is not None and where in (found.problem() or "")


def test_a_client_whose_workers_run_says_nothing_of_the_kind(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        running_pool(redis_server.url, tmp_path, 1) as pool,
        caplog.at_level(logging.WARNING, "convoq.client"),
        pool.client() as client,
    ):
        assert client.submit("c1", "hi", agent="echo").wait(30).text == "seen: hi"
        found = wait_until(lambda: (d := client.deployment()).alive and d, 30, what="alive")
        assert found.ever_registered and found.alive == [pool.workers[0].name]
        assert found.problem() is None
        assert "no convoq worker" not in caplog.text
        # A wait that runs out while workers are alive: the usual advice, nothing more.
        held = client.submit("c2", "hold me", agent="blocker")
        with pytest.raises(TurnTimeoutError) as ran_out:
            held.wait(0.1)
        assert "wait longer" in ran_out.value.message
        assert "no convoq worker" not in ran_out.value.message
        Redis.from_url(redis_server.url).set(f"{pool.prefix}:test:release:hold", 1, ex=60)
        assert held.wait(30).text == "released hold me"

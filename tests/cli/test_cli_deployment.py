"""``convoq status`` without arguments and ``convoq workers``: which Redis, the workers
alive and dead (a kill -9'd one turns dead, then drops out), and a warning when no
worker ever registered on that Redis."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from convoq.cli import app
from convoq.redis import embedded
from tests.support.redis_server import RedisServer
from tests.support.workers import running_pool, wait_until

pytestmark = pytest.mark.slow


def _run(env: dict[str, str | None], *args: str, code: int = 0) -> str:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **env})
    output = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exit_code == code, output
    assert "Traceback" not in output
    return output


def test_status_on_an_empty_embedded_redis_names_it_and_says_no_worker_registered(
    tmp_path: Path,
) -> None:
    home = tmp_path / ".convoq"
    unset = {k: None for k in os.environ if k.startswith("CONVOQ_")}
    try:
        out = _run({**unset, "CONVOQ_HOME": str(home)}, "status")
    finally:
        embedded.stop(home)
    assert f"the embedded Redis under {home.resolve()}" in out
    assert "workers: 0 alive, 0 dead" in out
    assert "warning: no convoq worker has ever registered on the embedded Redis" in out


def test_workers_and_status_show_a_killed_worker_dead_then_drop_it(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    with running_pool(redis_server.url, tmp_path, 2, sweep_interval_s=0.5) as pool:
        env: dict[str, str | None] = dict(pool.env)
        victim, survivor = pool.workers
        listed = wait_until(
            lambda: (out := _run(env, "workers")).count(" yes ") == 2 and out,
            30,
            what="two workers alive",
        )
        assert victim.name in listed and survivor.name in listed
        victim.kill()
        wait_until(lambda: "1 alive, 1 dead" in _run(env, "status"), 30, what="one dead, in status")
        dead = next(line for line in _run(env, "workers").splitlines() if victim.name in line)
        assert "dead" in dead and "s ago" in dead
        wait_until(lambda: victim.name not in _run(env, "workers"), 60, what="dropped")
        out = wait_until(  # the survivor alive: no warning (eventually, under any load)
            lambda: "no convoq worker" not in (shown := _run(env, "status")) and shown,
            30,
            what="status without a warning",
        )
        assert redis_server.url in out and "1 alive, 0 dead" in out


def test_status_with_a_conversation_but_no_turn_is_a_usage_error(
    redis_server: RedisServer,
) -> None:
    out = _run({"CONVOQ_REDIS_URL": redis_server.url}, "status", "c1", code=2)
    assert "CONVERSATION_ID TURN_ID" in out

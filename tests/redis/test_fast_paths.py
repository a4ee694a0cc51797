"""The one switch over convoq's shortcuts into other libraries' internals
(``CONVOQ_FAST_PATHS``): resolved like every setting; with it off no hot command goes
direct (counted by the direct sender's own metric while Redis still sees the commands),
kicks go through ``send_task`` and a worker keeps no line of its own; with it on a bug
inside the direct sender is raised, never turned into a quiet fallback to redis-py."""

from __future__ import annotations

import importlib.metadata
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import signals
from packaging.specifiers import SpecifierSet
from prometheus_client import REGISTRY

from convoq import settings as settings_module
from convoq.client import AsyncClient
from convoq.errors import ConfigurationError
from convoq.memory.redis import RedisConversationMemory
from convoq.messages import Message
from convoq.observe import tracing
from convoq.queue import transport
from convoq.queue.routing import partition_of
from convoq.redis import _pipelined, connect
from convoq.redis.scripts import Scripts
from convoq.settings import ConvoqSettings, fast_paths
from convoq.worker import _direct, _fair
from convoq.worker._fair import SlotBacklog
from convoq.worker.app import worker_config
from tests.support.workers import WorkerPool, broker_pushes

# Run again with the fast paths off by `make test-slowpaths`.
pytestmark = pytest.mark.slowpaths

CID = "fast paths"


def direct_calls(kind: str) -> float:
    """Batches the direct sender sent so far in this process (its histogram's count)."""
    value = REGISTRY.get_sample_value("convoq_redis_direct_seconds_count", {"kind": kind})
    return value or 0.0


def fallbacks(reason: str) -> float:
    labels = {"reason": reason}
    return REGISTRY.get_sample_value("convoq_redis_direct_fallbacks_total", labels) or 0.0


def redis_calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0)) - int(stats.get("failed_calls", 0))


@pytest.mark.parametrize("value", ["off", "0", "false", "OFF", "False"])
def test_the_switch_turns_off_by_its_variable(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVOQ_FAST_PATHS", value)
    assert fast_paths() is False
    assert ConvoqSettings.resolve().fast_paths is False
    assert fast_paths(True) is True  # an explicit argument wins


def test_the_switch_is_on_by_default_and_a_bad_value_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CONVOQ_FAST_PATHS", raising=False)
    assert fast_paths() is True
    assert fast_paths(False) is False
    monkeypatch.setenv("CONVOQ_FAST_PATHS", "sometimes")
    with pytest.raises(ConfigurationError, match="CONVOQ_FAST_PATHS"):
        fast_paths()


def test_the_switch_is_read_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # Another bad setting is for its own entry point to report, not for the switch.
    monkeypatch.setenv("CONVOQ_PARTITIONS", "many")
    monkeypatch.setenv("CONVOQ_FAST_PATHS", "off")
    assert fast_paths() is False


# -- the direct RESP path ---------------------------------------------------------------------
@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Any]:
    aclient = connect(redis_url)
    yield aclient
    await aclient.aclose()


async def a_few_turns(memory: RedisConversationMemory, cid: str) -> list[Message]:
    await memory.aappend(cid, [Message.user("q1"), Message.assistant("a1")])
    await memory.aappend(cid, [Message.user("q2"), Message.assistant("a2")])
    return await memory.aload(cid, last_turns=1)


@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
async def test_hot_commands_go_direct_only_with_the_switch_on(
    on: bool,
    client: Any,
    key_prefix: str,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONVOQ_FAST_PATHS", "on" if on else "off")
    memory = RedisConversationMemory(client=client, prefix=key_prefix)
    reads, scripts = direct_calls("read"), direct_calls("script")
    evalsha, execs = redis_calls(redis_client, "evalsha"), redis_calls(redis_client, "exec")
    window = await a_few_turns(memory, CID)
    assert window == [Message.user("q2"), Message.assistant("a2")]
    # Redis ran the same commands either way: the appends' scripts and the window read.
    assert redis_calls(redis_client, "evalsha") >= evalsha + 2
    assert redis_calls(redis_client, "exec") >= execs + 1
    if on:
        assert direct_calls("script") >= scripts + 2
        assert direct_calls("read") >= reads + 1
    else:
        assert (direct_calls("read"), direct_calls("script")) == (reads, scripts)


@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
def test_sync_calls_go_direct_only_with_the_switch_on(
    on: bool, redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVOQ_FAST_PATHS", "on" if on else "off")
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    try:
        scripts = direct_calls("script")
        memory.append(CID, [Message.user("q"), Message.assistant("a")])
        assert memory.load(CID) == [Message.user("q"), Message.assistant("a")]
        assert (direct_calls("script") > scripts) is on
    finally:
        memory.close()


async def test_an_explicit_setting_decides_over_the_variable(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVOQ_FAST_PATHS", "on")
    scripts = Scripts(client, fast_paths_on=False)
    before = direct_calls("script")
    reply = await scripts.run("touch", ["k1"], [1])  # any script: its reply is its status
    assert reply
    assert direct_calls("script") == before
    assert _pipelined.direct_for(client, False) is None
    assert _pipelined.direct_for(client) is not None


@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
async def test_the_protocol_built_from_settings_takes_their_switch(
    on: bool, redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An explicit ``fast_paths`` reaches the script runner inside the turn protocol of
    a client (and of the worker, gateway and memory: they build it the same way)."""
    monkeypatch.setenv("CONVOQ_FAST_PATHS", "off" if on else "on")
    settings = ConvoqSettings.resolve(redis_url=redis_url, prefix=key_prefix, fast_paths=on)
    async with AsyncClient(settings=settings) as aclient:
        scripts = direct_calls("script")
        await aclient.protocol.submit(CID, "t1", agent="bot", message=Message.user("q"), options={})
        assert (await aclient.protocol.get_turn(CID, "t1")).status == "queued"
        assert (direct_calls("script") > scripts) is on


@pytest.mark.fast_paths
async def test_a_bug_inside_the_direct_read_is_raised_not_sent_again_through_redis_py(
    client: Any, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = RedisConversationMemory(client=client, prefix=key_prefix)
    await memory.aappend(CID, [Message.user("q"), Message.assistant("a")])

    async def broken_replies(connection: Any, count: int) -> Any:
        raise TypeError("a bug in the reply reader")

    monkeypatch.setattr(_pipelined, "_replies_of", broken_replies)
    with pytest.raises(TypeError, match="a bug in the reply reader"):
        await memory.aload(CID)
    with pytest.raises(TypeError, match="a bug in the reply reader"):
        await memory.aappend(CID, [Message.user("q2"), Message.assistant("a2")])
    monkeypatch.undo()
    # Redis ran the append (only reading its reply broke); the error reached the caller
    # instead of a quiet second send through redis-py, and the next calls work.
    assert await memory.aload(CID) == [
        Message.user("q"),
        Message.assistant("a"),
        Message.user("q2"),
        Message.assistant("a2"),
    ]


@pytest.mark.fast_paths
async def test_an_argument_it_does_not_pack_goes_to_redis_py_and_is_counted(
    client: Any,
) -> None:
    direct = _pipelined.AsyncDirect(client)
    before = fallbacks("argument")
    assert await direct.read([("GET", 0.5)], transaction=False) is None
    assert fallbacks("argument") == before + 1


def test_the_installed_libraries_are_within_the_releases_the_shortcuts_were_checked_with() -> None:
    bounds = [
        _pipelined.CHECKED_WITH,
        *transport.CHECKED_WITH,
        _fair.CHECKED_WITH,
        _direct.CHECKED_WITH,
    ]
    for package, specifier in bounds:
        installed = importlib.metadata.version(package)
        assert installed in SpecifierSet(specifier), (
            f"{package} {installed} is outside {specifier}: check the shortcut against it,"
            " then widen the bound"
        )


# -- the template kick ------------------------------------------------------------------------
@pytest.fixture
def publishes() -> Iterator[list[tuple[str, str]]]:
    """``(task name, queue)`` of each task published through Celery (``send_task``) in
    this process (other tests' clients may still publish: look for your queue)."""
    seen: list[tuple[str, str]] = []

    def count(sender: Any = None, routing_key: Any = None, **_: Any) -> None:
        seen.append((str(sender), str(routing_key)))

    signals.before_task_publish.connect(count, weak=False)
    yield seen
    signals.before_task_publish.disconnect(count)


@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
async def test_kicks_go_through_send_task_with_the_switch_off(
    on: bool,
    redis_url: str,
    key_prefix: str,
    redis_client: redis.Redis,
    publishes: list[tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A submit inside a trace sends its kick through send_task whatever the switch (the
    # template cannot carry the trace context): another test of this process may have
    # installed a tracer, so this one submits with no trace to carry.
    monkeypatch.setattr(tracing, "carrier", lambda: {})
    settings = ConvoqSettings.resolve(
        redis_url=redis_url, prefix=key_prefix, partitions=2, fast_paths=on
    )
    async with AsyncClient(settings=settings) as aclient:
        handle = await aclient.submit("kicked", "hello", agent="echo")
        queue = f"{key_prefix}.p{partition_of('kicked', 2)}"
        # One kick in the broker's list either way, naming the turn heading the inbox.
        kicks = redis_client.lrange(queue, 0, -1)
        assert len(kicks) == 1
        assert handle.turn_id in kicks[0].decode()
    ours = [task for task, routed in publishes if routed == queue]
    assert ours == ([] if on else ["convoq.drain"])


# -- the worker's own line --------------------------------------------------------------------
def ids_in(partition: int, count: int, partitions: int = 2) -> list[str]:
    found = (f"c{n}-{uuid.uuid4().hex[:6]}" for n in itertools.count())
    chosen = (cid for cid in found if partition_of(cid, partitions) == partition)
    return list(itertools.islice(chosen, count))


@pytest.mark.slow
def test_with_the_switch_off_a_worker_sends_conversations_back_through_the_broker(
    redis_url: str, tmp_path: Path, redis_client: redis.Redis
) -> None:
    pool = WorkerPool(
        redis_url,
        tmp_path,
        concurrency=1,
        partitions=2,
        agents="tests.support.fair_agents",
        fast_paths="off",
    )
    pool.start()
    try:
        cids = [*ids_in(0, 1), *ids_in(1, 1)]
        with broker_pushes(redis_client, pool) as pushes, pool.client() as client:
            handles = [client.submit(cid, f"{cid} {n}", agent="slow") for cid in cids
                       for n in range(3)]  # fmt: skip
            assert all(handle.wait(60).ok for handle in handles)
            published = pushes()
        # Each conversation gave its one slot up to the other after a turn: with no line
        # of its own, the worker sent it back through the broker (more messages than the
        # two first kicks), and every turn still ran, in order.
        assert published > len(cids)
        assert "go back through the broker (fast paths off)" in pool.logs()
    finally:
        pool.stop_all()


# -- each shortcut only inside the releases it was checked with -------------------------------
OUTSIDE = ">=0.0.1,<0.0.2"  # no release of any of the libraries is in it


@pytest.fixture
def warned(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> Any:
    """The shortcuts' "turned itself off" warnings logged from now on, by shortcut; this
    process's memory of the ones already said starts empty (it is the process's own)."""
    monkeypatch.setattr(settings_module, "_WARNED", set(), raising=False)
    monkeypatch.setenv("CONVOQ_FAST_PATHS", "on")
    caplog.set_level(logging.WARNING, logger="convoq")

    def said(name: str) -> int:
        return sum(f"fast path {name} is off" in r.getMessage() for r in caplog.records)

    return said


@pytest.mark.parametrize("inside", [True, False], ids=["checked", "outside"])
async def test_direct_commands_only_with_a_checked_redis_py(
    inside: bool, client: Any, key_prefix: str, warned: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not inside:
        monkeypatch.setattr(_pipelined, "CHECKED_WITH", ("redis", OUTSIDE))
    for _ in range(2):  # two stores, one warning
        memory = RedisConversationMemory(client=client, prefix=key_prefix)
        scripts, reads = direct_calls("script"), direct_calls("read")
        window = await a_few_turns(memory, f"{CID} {uuid.uuid4().hex}")
        assert window == [Message.user("q2"), Message.assistant("a2")]
        assert (direct_calls("script") > scripts, direct_calls("read") > reads) == (
            inside,
            inside,
        )
    assert _pipelined.enabled_for(client) is inside
    assert warned("redis direct") == (0 if inside else 1)


@pytest.mark.parametrize("inside", [True, False], ids=["checked", "outside"])
async def test_template_kicks_only_with_a_checked_celery_and_kombu(
    inside: bool,
    redis_url: str,
    key_prefix: str,
    publishes: list[tuple[str, str]],
    warned: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(tracing, "carrier", lambda: {})  # as in the test above
    if not inside:
        kombu = importlib.metadata.version("kombu")
        monkeypatch.setattr(transport, "CHECKED_WITH", (("celery", ">=5.4"), ("kombu", OUTSIDE)))
    settings = ConvoqSettings.resolve(redis_url=redis_url, prefix=key_prefix, partitions=2)
    for n in range(2):  # two clients, one warning
        async with AsyncClient(settings=settings) as aclient:
            await aclient.submit(f"kicked {n}", "hello", agent="echo")
    ours = [task for task, queue in publishes if queue.startswith(f"{key_prefix}.p")]
    assert ours == ([] if inside else ["convoq.drain"] * 2)
    assert warned("template kick") == (0 if inside else 1)
    if not inside:
        said = next(r.getMessage() for r in caplog.records if "template kick" in r.getMessage())
        assert f"kombu {kombu} is outside the releases it was checked with ({OUTSIDE})" in said


@pytest.mark.parametrize("inside", [True, False], ids=["checked", "outside"])
def test_the_own_line_and_direct_kicks_only_with_a_checked_celery(
    inside: bool, warned: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not inside:
        monkeypatch.setattr(_fair, "CHECKED_WITH", ("celery", OUTSIDE))
        monkeypatch.setattr(_direct, "CHECKED_WITH", ("celery", OUTSIDE))
    settings = ConvoqSettings(concurrency=2)
    for _ in range(2):  # two workers' worth of asking, one warning each
        # Without its own line a process holds no kicks beyond its slots.
        config = worker_config(settings, "redis://x")
        expected = _fair.PREFETCH_MULTIPLIER if inside else 1
        assert config["worker_prefetch_multiplier"] == expected
        assert SlotBacklog(2, lambda: 0, lambda cid, head, fence: None).own_line is inside
        # What the drain task's registration asks before it names the direct strategy.
        assert _direct.enabled(settings.fast_paths) is inside
    assert (warned("own line"), warned("direct kicks")) == ((0, 0) if inside else (1, 1))


def test_the_switch_off_decides_first_and_says_nothing(
    warned: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_fair, "CHECKED_WITH", ("celery", OUTSIDE))
    monkeypatch.setenv("CONVOQ_FAST_PATHS", "off")
    assert _fair.enabled() is False
    assert _fair.enabled(False) is False
    assert warned("own line") == 0
    # An explicit on still stays off outside the checked releases.
    assert _fair.enabled(True) is False
    assert warned("own line") == 1

"""A Redis the client cannot reach is a ConvoqError naming it, from every public client
and handle method, sync and async: never redis-py's own ConnectionError or TimeoutError."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from convoq import errors
from convoq._ports import free_loopback_port
from convoq.client import AsyncClient, AsyncTurnHandle, Client, TurnHandle

Call = Callable[[Any, Any], Any]

# name -> what it does with (client, handle): every public method of both flavours.
CALLS: dict[str, Call] = {
    "connect": lambda c, h: c.connect(),
    "submit": lambda c, h: c.submit("c1", "hi", agent="echo"),
    "approve": lambda c, h: c.approve(h, "call-1"),
    "deny": lambda c, h: c.deny(h, "call-1"),
    "discard": lambda c, h: c.discard(h),
    "cancel": lambda c, h: c.cancel(h),
    "retry": lambda c, h: c.retry(h),
    "history": lambda c, h: c.history("c1"),
    "usage": lambda c, h: c.usage("c1"),
    "clear": lambda c, h: c.clear("c1"),
    "awaiting_approval": lambda c, h: c.awaiting_approval(),
    "registered_agents": lambda c, h: c.registered_agents(),
    "workers": lambda c, h: c.workers(),
    "ping": lambda c, h: c.ping(timeout_s=5),
    "handle.record": lambda c, h: h.record(),
    "handle.status": lambda c, h: h.status(),
    "handle.result": lambda c, h: h.result(),
    "handle.wait": lambda c, h: h.wait(5),
    "handle.approve": lambda c, h: h.approve("call-1"),
    "handle.deny": lambda c, h: h.deny("call-1"),
    "handle.cancel": lambda c, h: h.cancel(),
    "handle.retry": lambda c, h: h.retry(),
    "handle.discard": lambda c, h: h.discard(),
}


@pytest.fixture
def refusing_url() -> str:
    """A Redis URL (with a password) at a loopback port nothing listens on."""
    return f"redis://:s3cret-pw@127.0.0.1:{free_loopback_port()}/0"


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A Redis URL at a socket that takes connections and never answers (short timeout)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # connections complete in the backlog; nothing is ever read
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0?socket_timeout=0.2"


def _check(name: str, outcome: BaseException | None, where: str) -> list[str]:
    """What is wrong with how ``name`` failed (empty when it raised the right error)."""
    if not isinstance(outcome, errors.ConvoqError):
        return [f"{name}: raised {outcome!r}"]
    wrong = []
    if type(outcome).__name__ != "RedisUnavailableError":
        wrong.append(f"{name}: {type(outcome).__name__}")
    if where not in outcome.message or "s3cret" in outcome.message:
        wrong.append(f"{name}: {outcome.message!r} does not name {where} (unredacted)")
    if "CONVOQ_REDIS_URL" not in outcome.message:
        wrong.append(f"{name}: {outcome.message!r} does not say what to do")
    return wrong


async def _async_outcome(call: Callable[[], Awaitable[Any]]) -> BaseException | None:
    try:
        await call()
    except Exception as exc:
        return exc
    return None


def test_every_async_method_names_the_redis_it_cannot_reach(refusing_url: str) -> None:
    async def main() -> dict[str, BaseException | None]:
        client = AsyncClient(refusing_url, prefix="unreach")
        handle = client.handle("c1", "t1")

        async def stream() -> None:
            async for _ in handle.events(timeout=5):
                pass

        calls = {name: (lambda call=call: call(client, handle)) for name, call in CALLS.items()}
        calls["handle.events"] = stream
        try:
            outcomes = await asyncio.gather(*(_async_outcome(c) for c in calls.values()))
        finally:
            await client.aclose()
        return dict(zip(calls, outcomes, strict=True))

    outcomes = asyncio.run(main())
    where = refusing_url.replace("s3cret-pw", "***")
    wrong = [w for name, outcome in outcomes.items() for w in _check(name, outcome, where)]
    assert not wrong, "\n".join(wrong)
    assert isinstance(outcomes["history"], errors.ConvoqError)
    assert outcomes["history"].details["redis"] == where


def _sync_outcome(call: Callable[[], Any]) -> BaseException | None:
    try:
        call()
    except Exception as exc:
        return exc
    return None


def test_every_sync_method_names_the_redis_it_cannot_reach(refusing_url: str) -> None:
    client = Client(refusing_url, prefix="unreach")
    handle = client.handle("c1", "t1")
    assert isinstance(handle, TurnHandle) and isinstance(handle.async_handle, AsyncTurnHandle)
    calls = {name: (lambda call=call: call(client, handle)) for name, call in CALLS.items()}
    calls["handle.events"] = lambda: list(handle.events(timeout=5))
    try:
        # In threads: each call spends the client's reconnect retries before it fails.
        with ThreadPoolExecutor(len(calls)) as pool:
            outcomes = dict(zip(calls, pool.map(_sync_outcome, calls.values()), strict=True))
    finally:
        client.close()
    where = refusing_url.replace("s3cret-pw", "***")
    wrong = [w for name, outcome in outcomes.items() for w in _check(name, outcome, where)]
    assert not wrong, "\n".join(wrong)


def test_a_redis_that_never_answers_is_named_too(silent_url: str) -> None:
    client = Client(silent_url, prefix="unreach")
    try:
        with pytest.raises(errors.ConvoqError) as raised:
            client.history("c1")
    finally:
        client.close()
    assert type(raised.value).__name__ == "RedisUnavailableError"
    assert silent_url in raised.value.message and "Timeout" in raised.value.details["reason"]

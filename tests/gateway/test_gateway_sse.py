"""The gateway's SSE body on its own, against a real Redis: keep-alive comments while a
turn waits, and the bound on one response (the reader reconnects with Last-Event-ID)."""

from __future__ import annotations

from convoq.client import AsyncClient
from convoq.gateway.sse import turn_events


async def test_a_waiting_turn_gets_keepalives_and_the_response_is_bounded(
    redis_url: str, key_prefix: str
) -> None:
    async with AsyncClient(redis_url, prefix=key_prefix, partitions=4, agents=["echo"]) as client:
        handle = await client.submit("sse-1", "nobody runs me", agent="echo")  # no worker
        chunks = [c async for c in turn_events(handle, "0", keepalive_s=0.2, max_s=1.0)]
    assert chunks[0].startswith("retry: 1000\n")
    events = [c for c in chunks if c.startswith("id: ")]
    assert len(events) == 1 and "event: status" in events[0] and '"queued"' in events[0]
    assert chunks.count(": keepalive\n\n") >= 2
    assert chunks[-1] == ": keepalive\n\n"  # ended by the bound, not by a done event

"""A turn's event stream as Server-Sent Events, resumable with ``Last-Event-ID``.

Each event goes out as ``id: <stream id>``, ``event: <type>``, ``data: <JSON>``; the id is
the event's id in the turn's Redis stream, so a reader that lost its connection reconnects
with ``Last-Event-ID`` (browsers' EventSource do it by themselves) and gets exactly the
events after it. The response ends after ``done``; with ``settled`` it also ends at an
``awaiting_approval`` status event while the turn is still parked for approval (a reader
that wants what follows the decision reconnects with ``Last-Event-ID``), and at a
``scheduled`` one while the turn still waits for its time. Between events a
comment line goes out every ``keepalive_s`` so proxies keep the connection open; the whole
response is bounded by ``max_s`` (the reader reconnects and goes on).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator

from convoq.client import AsyncTurnHandle
from convoq.errors import TurnTimeoutError
from convoq.gateway.inputs import EVENT_ID
from convoq.gateway.problems import GatewayError
from convoq.turn_state import TurnEvent

# At most 19 digits a part: every such id fits the two unsigned 64-bit numbers of a Redis
# stream id (a larger one would fail XREAD after the response began).
_STREAM_ID = re.compile(EVENT_ID)
KEEPALIVE_S = 15.0
MAX_S = 900.0


def check_event_id(value: str | None) -> str:
    """A Redis stream id to read after ("0": from the start); 422 for anything else."""
    if value is None or value == "":
        return "0"
    if not _STREAM_ID.fullmatch(value):
        raise GatewayError(
            422, "InvalidEventId", "Last-Event-ID must be an event id this stream sent"
        )
    return value


async def turn_events(
    handle: AsyncTurnHandle,
    after: str,
    *,
    keepalive_s: float = KEEPALIVE_S,
    max_s: float = MAX_S,
    settled: bool = False,
) -> AsyncIterator[str]:
    """The SSE body: events after ``after`` until ``done`` (or ``max_s``); with
    ``settled``, also until the turn is parked for approval or waits for its time."""
    yield f"retry: 1000\n: following turn {handle.turn_id}\n\n"
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        try:
            async for event_id, event in handle.events_with_ids(after=after, timeout=keepalive_s):
                after = event_id
                data = json.dumps(event.data, separators=(",", ":"))
                yield f"id: {event_id}\nevent: {event.type}\ndata: {data}\n\n"
                if settled and _rests(event) and await _resting(handle, event):
                    return
            return  # done (or final with its stream expired)
        except TurnTimeoutError:
            yield ": keepalive\n\n"


_RESTING = ("awaiting_approval", "scheduled")


def _rests(event: TurnEvent) -> bool:
    return event.type == "status" and event.data.get("status") in _RESTING


async def _resting(handle: AsyncTurnHandle, event: TurnEvent) -> bool:
    """Still parked (or scheduled): a turn that moved on since that status event goes on
    to later events."""
    return (await handle.record()).status == event.data.get("status")

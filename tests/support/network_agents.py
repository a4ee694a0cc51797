"""Agent profiles of the half-open and Sentinel tests
(``CONVOQ_AGENTS=tests.support.network_agents``): scripted models that touch no Redis
themselves, so only convoq's own connections cross the network under test.

``waiter`` holds its model call until the file ``<first word of the message>`` exists in
the directory ``CONVOQ_TEST_FLAGS`` names (an hour at most), then answers.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from convoq import Agent
from convoq.models import ModelRequest, ScriptedModel


async def _wait_for_flag(request: ModelRequest) -> str:
    text = request.messages[-1].text
    flag = Path(os.environ["CONVOQ_TEST_FLAGS"]) / text.split(" ", 1)[0]
    deadline = time.monotonic() + 3600
    while not flag.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return f"released {text}"


async def _echo(request: ModelRequest) -> str:
    return f"seen: {request.messages[-1].text}"


waiter = Agent(ScriptedModel(_wait_for_flag, name="waiter"), name="waiter")
echo = Agent(ScriptedModel(_echo, name="echo"), name="echo")

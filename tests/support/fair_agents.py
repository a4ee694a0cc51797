"""Agent profiles of the fair-slots test (``CONVOQ_AGENTS=tests.support.fair_agents``).

``slow`` answers after 0.3 s. ``gated`` does too, but first waits (up to 30 s) until the
test opens its gate (the key ``{prefix}:test:fair:open``): a test queues every turn and
lets the worker take every kick before the first turn can end, however loaded the machine
is (a turn ending first would send its conversation back in line ahead of kicks still on
their way, which is fair, but not the order the test means to check).
"""

from __future__ import annotations

import asyncio

from convoq import Agent
from convoq.models import ModelRequest, ScriptedModel
from tests.support.worker_agents import test_key, test_redis

GATE_WAIT_S = 30.0


async def _a_while(request: ModelRequest) -> str:
    await asyncio.sleep(0.3)
    return f"done {request.messages[-1].text}"


async def _behind_the_gate(request: ModelRequest) -> str:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GATE_WAIT_S
    gate = test_key("fair", "open")
    while not await asyncio.to_thread(test_redis().exists, gate):
        if loop.time() > deadline:
            raise TimeoutError("the test never opened the gate")
        await asyncio.sleep(0.05)
    return await _a_while(request)


slow = Agent(ScriptedModel(_a_while, name="slow"), name="slow")
gated = Agent(ScriptedModel(_behind_the_gate, name="gated"), name="gated")

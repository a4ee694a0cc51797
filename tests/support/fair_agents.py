"""Agent profiles of the fair-slots test (``CONVOQ_AGENTS=tests.support.fair_agents``)."""

from __future__ import annotations

import asyncio

from convoq import Agent
from convoq.models import ModelRequest, ScriptedModel


async def _a_while(request: ModelRequest) -> str:
    # Long enough that every turn of the test is queued before the first one ends.
    await asyncio.sleep(0.3)
    return f"done {request.messages[-1].text}"


slow = Agent(ScriptedModel(_a_while, name="slow"), name="slow")

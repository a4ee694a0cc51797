"""Agent profiles of the backlog tests (fairness under a 1,000-turn conversation, a
partition roll): ``CONVOQ_AGENTS=tests.support.backlog_agents``."""

from __future__ import annotations

import asyncio

from convoq import Agent
from convoq.models import ModelRequest, ScriptedModel


def _at_once(request: ModelRequest) -> str:
    return f"ok {request.messages[-1].text}"


async def _briefly(request: ModelRequest) -> str:
    # Long enough that turns are still queued while workers are rolled.
    await asyncio.sleep(0.02)
    return f"ok {request.messages[-1].text}"


# One previous turn in the window: a 1,000-turn conversation loads a turn's worth, not all.
quick = Agent(ScriptedModel(_at_once, name="quick"), name="quick", keep_last_turns=1)
brief = Agent(ScriptedModel(_briefly, name="brief"), name="brief", keep_last_turns=1)

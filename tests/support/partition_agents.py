"""Profiles the partition tests run beside those of :mod:`tests.support.chaos_agents`
(``CONVOQ_AGENTS=tests.support.chaos_agents,tests.support.partition_agents``)."""

from __future__ import annotations

import time

from convoq import Agent, Message
from convoq.models import ModelRequest, ScriptedModel
from tests.support.chaos_agents import effect_fn, record


def slow_effect_fn(request: ModelRequest) -> str | Message:
    """``effect``'s answers, each after most of a second: a run is long enough for a
    link cut at its start to land inside it."""
    time.sleep(0.8)
    return effect_fn(request)


slow_effect = Agent(ScriptedModel(slow_effect_fn), name="slow_effect", tools=[record])

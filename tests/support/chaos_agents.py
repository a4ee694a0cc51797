"""Profiles for the chaos tests: no Redis access of their own, so a Redis outage reaches
only convoq's own code paths."""

from __future__ import annotations

import time

from convoq import Agent
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel


def slow_echo_fn(request: ModelRequest) -> str:
    """Takes a while (so turns are in flight when Redis dies), then echoes the user texts."""
    time.sleep(0.15)
    users = [m.text for m in request.messages if m.role == MessageRole.USER]
    return "seen: " + " | ".join(users)


slow_echo = Agent(ScriptedModel(slow_echo_fn), name="slow_echo")

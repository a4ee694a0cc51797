"""Worker profiles that stream text (``CONVOQ_AGENTS=tests.support.delta_agents``): a
300-byte reply streamed word by word at once, and a model that streams its first words,
then waits (bounded) until the test releases it before it streams the rest."""

from __future__ import annotations

import asyncio

from convoq import Agent
from convoq.messages import Message
from convoq.models import ModelRequest, ScriptedModel
from convoq.models.base import TextDeltaHandler
from tests.support.worker_agents import test_key, test_redis

LONG = ("It depends on the weather and the trains. " * 8)[:300]
FIRST, REST = "The first words", " and then, once released, the rest."


class PacedModel:
    """Streams :data:`FIRST`, waits for ``{prefix}:test:release:{word}`` (the user's text;
    20 s at most), then streams :data:`REST`."""

    name = "paced"

    async def request(
        self, request: ModelRequest, *, on_text_delta: TextDeltaHandler | None = None
    ) -> Message:
        word = request.messages[-1].text
        if on_text_delta is not None:
            await on_text_delta(FIRST)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while not test_redis().exists(test_key("release", word)) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if on_text_delta is not None:
            await on_text_delta(REST)
        return Message.assistant(FIRST + REST)


long_reply = Agent(ScriptedModel(lambda _request: LONG, name="long"), name="long_reply")
paced = Agent(PacedModel(), name="paced")

"""A profile answered by a Chat Completions server over HTTP (RETRACT_MODEL_URL, the
test's :class:`~tests.support.openai_server.OpenAIServer`), retrying quickly: for the
test of a stream dropped after its text went out."""

from __future__ import annotations

import os

from convoq import Agent
from convoq.models.openai import OpenAIChatModel

model = OpenAIChatModel(
    "retract-model",
    base_url=os.environ.get("RETRACT_MODEL_URL", "http://127.0.0.1:9/v1"),
    api_key="test-key",
    max_retries=2,
    retry_base_delay=0.05,
)
streamer = Agent(model, name="streamer")

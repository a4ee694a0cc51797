"""The profile of the model-fault chaos run: ``effect``'s turn (call ``record`` with the
user's text, then echo every user text seen) answered by a Chat Completions server over
HTTP (CHAOS_MODEL_URL, a :class:`~tests.support.model_faults.FaultyWireServer`)."""

from __future__ import annotations

import os
import uuid

from convoq import Agent
from convoq.models.openai import OpenAIChatModel
from tests.support.chaos_agents import record
from tests.support.wire_server import Said, Seen

MAX_RETRIES = 3
ATTEMPT_TIMEOUT_S = 1.5
RETRY_BASE_DELAY_S = 0.2


class CallTaggedChat(OpenAIChatModel):
    """Chat Completions whose requests say which model call they belong to: one
    ``x-chaos-call`` for a call's first attempt and its retries (the auth headers are
    made once per call), and the worker process that made it (``x-chaos-pid``)."""

    def _auth_headers(self) -> dict[str, str]:
        tags = {"x-chaos-call": uuid.uuid4().hex, "x-chaos-pid": str(os.getpid())}
        return {**super()._auth_headers(), **tags}


def answer(seen: Seen) -> Said:
    """The server's side of ``faulty``: a ``record`` call for the last user text, then,
    given its result, every user text seen."""
    users = [item.text for item in seen.items if item.role == "user"]
    if seen.items[-1].role == "tool":
        return Said(text="seen: " + " | ".join(users))
    return Said(calls=[(f"record-{len(seen.items)}", "record", {"text": users[-1]})])


model = CallTaggedChat(
    "chaos-model",
    base_url=os.environ.get("CHAOS_MODEL_URL", "http://127.0.0.1:9/v1"),
    api_key="test-key",
    max_retries=MAX_RETRIES,
    attempt_timeout=ATTEMPT_TIMEOUT_S,
    total_timeout=60,
    retry_base_delay=RETRY_BASE_DELAY_S,
)
faulty = Agent(model, name="faulty", tools=[record])

"""Worker profiles on the Responses and Anthropic models (CONVOQ_AGENTS=tests.support.api_agents).

Their servers are loopback servers of the test: ``TEST_RESPONSES_URL`` and
``TEST_ANTHROPIC_URL`` in the worker's environment say where.
"""

from __future__ import annotations

import os

from convoq import Agent, tool
from convoq.models import anthropic, responses


@tool
def get_weather(city: str) -> str:
    """Weather for a city."""
    return f"{city}: sunny"


claude = Agent(
    anthropic("claude-x", base_url=os.environ["TEST_ANTHROPIC_URL"], api_key="k"),
    name="claude",
    instructions="Be brief.",
    tools=[get_weather],
)
gpt = Agent(
    responses("gpt-x", base_url=os.environ["TEST_RESPONSES_URL"], api_key="k"),
    name="gpt",
    instructions="Be brief.",
    tools=[get_weather],
)

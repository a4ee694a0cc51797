"""Worker profiles on each model wire (CONVOQ_AGENTS=tests.support.cross_framework_agents).

Their servers are loopback servers of the test: ``TEST_CHAT_URL``, ``TEST_RESPONSES_URL``
and ``TEST_ANTHROPIC_URL`` in the worker's environment say where.
"""

from __future__ import annotations

import os

from convoq import Agent
from convoq.models import anthropic, openai, responses

chat = Agent(
    openai("gpt-x", base_url=os.environ["TEST_CHAT_URL"], api_key="k"),
    name="xf-chat",
    instructions="Be brief.",
)
gpt = Agent(
    responses("gpt-x", base_url=os.environ["TEST_RESPONSES_URL"], api_key="k"),
    name="xf-responses",
    instructions="Be brief.",
)
claude = Agent(
    anthropic("claude-x", base_url=os.environ["TEST_ANTHROPIC_URL"], api_key="k"),
    name="xf-anthropic",
    instructions="Be brief.",
)

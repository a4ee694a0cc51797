"""One ``Runner.run`` with a ``ConvoqSession`` on Redis, as its own OS process.

Usage: python agents_session_run.py REDIS_URL PREFIX SESSION_ID INPUT ANSWER

The OpenAI Agents SDK's own ScriptedModel answers ``ANSWER``; the process prints, as one
JSON line, the input items the model was sent and the run's final output.
"""

from __future__ import annotations

import asyncio
import json
import sys

from agents import Agent, RunConfig, Runner
from agents.testing import ScriptedModel, assistant_message

from convoq.integrations.openai_agents import ConvoqSession
from convoq.memory.redis import RedisConversationMemory


async def main() -> None:
    url, prefix, session_id, text, answer = sys.argv[1:6]
    model = ScriptedModel([[assistant_message(answer, item_id=f"msg-{answer}")]])
    agent = Agent(name="assistant", instructions="Be brief.", model=model)
    memory = RedisConversationMemory(url, prefix=prefix)
    try:
        session = ConvoqSession(session_id, memory)
        config = RunConfig(tracing_disabled=True)
        result = await Runner.run(agent, text, session=session, run_config=config)
        call = model.last_call
        assert call is not None
        print(json.dumps({"sent": call.input, "output": result.final_output}))
    finally:
        await memory.aclose()


if __name__ == "__main__":
    asyncio.run(main())

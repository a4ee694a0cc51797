"""Write ``COUNT`` two-item batches to one ConvoqSession on Redis, as its own OS process.

Usage: python agents_session_writes.py REDIS_URL PREFIX SESSION_ID TAG COUNT GO_FILE

Waits until GO_FILE exists so that several writers start at the same moment.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from convoq.integrations.openai_agents import ConvoqSession
from convoq.memory.redis import RedisConversationMemory


async def main() -> None:
    url, prefix, session_id, tag, count, go_file = sys.argv[1:7]
    deadline = time.monotonic() + 60
    while not Path(go_file).exists():
        if time.monotonic() > deadline:
            sys.exit("the start signal never came")
        await asyncio.sleep(0.005)
    memory = RedisConversationMemory(url, prefix=prefix)
    try:
        session = ConvoqSession(session_id, memory, busy_timeout_s=60)
        for n in range(int(count)):
            await session.add_items(
                [
                    {"role": "user", "content": f"{tag}-{n}"},
                    {"role": "assistant", "content": f"{tag}-{n} answered"},
                ]
            )
    finally:
        await memory.aclose()


if __name__ == "__main__":
    asyncio.run(main())

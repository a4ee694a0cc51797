"""What one writer per conversation costs an in-process Agent on Redis memory.

An Agent turn on :class:`RedisConversationMemory` takes the conversation's lease, loads
the history and stores the turn with a fenced append that frees the lease. This prints
the median time of such a turn (a scripted model answering at once) next to the same
turn on the same store with reservations kept in process only (the base class's hooks,
as before the lease), so the difference is the single-writer protocol: one more script
call per turn, plus the renewer task the turn starts and stops. Redis is a private
embedded redis-server on a unix socket.

Run ``python -m bench writer`` (or ``python -m bench.agent_writer``).
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable

from bench._harness import embedded_redis, print_run, timings_ms
from convoq import Agent
from convoq.memory import ConversationMemory
from convoq.memory.redis import RedisConversationMemory
from convoq.models import ScriptedModel

SAMPLES = 300
WARM_UP = 20


class InProcessOnly(RedisConversationMemory):
    """The same store, reserving conversations in this process only (no lease)."""

    areserve = ConversationMemory.areserve
    apark = ConversationMemory.apark
    acommit_turn = ConversationMemory.acommit_turn
    arelease = ConversationMemory.arelease


async def _median_ms(call: Callable[[int], Awaitable[object]]) -> float:
    for n in range(WARM_UP):
        await call(-n - 1)
    return statistics.median(await timings_ms(SAMPLES, call))


async def run() -> str:
    with embedded_redis() as (_work, url):
        return await _run(url)


async def _run(url: str) -> str:
    memories = [RedisConversationMemory(url, prefix="bench"), InProcessOnly(url, prefix="bench")]
    try:
        medians = []
        for memory in memories:
            agent = Agent(ScriptedModel(lambda _: "answer"), memory=memory, keep_last_turns=10)
            cid = type(memory).__name__

            async def turn(n: int, agent: Agent = agent, cid: str = cid) -> None:
                await agent.agenerate(f"q{n}", conversation_id=cid)

            medians.append(await _median_ms(turn))
        leased, local = medians
        return (
            f"Agent turns on Redis memory, medians of {SAMPLES} (embedded redis-server,"
            " unix socket)\n"
            f"  lease + fenced commit (one writer across processes) {leased:7.3f} ms\n"
            f"  in-process reservation only (before)                {local:7.3f} ms\n"
            f"  single-writer overhead per turn                     {leased - local:7.3f} ms"
        )
    finally:
        for memory in memories:
            await memory.aclose()


def main() -> None:
    print_run(run)


if __name__ == "__main__":
    main()

"""Reading the last N messages of a long LangChain chat history: convoq's
``ConvoqChatMessageHistory(last_n_messages=N)`` against langchain-community's
``RedisChatMessageHistory`` (which has no window: it reads the whole list, LRANGE 0 -1,
and the caller keeps the last N).

Each history lives on its own private redis-server (AOF everysec), populated before any
timing with the same conversation (one turn = a human message of ~200 chars and an AI
message of ~600). Rounds alternate which side goes first; each round's figure is the
median of its reads, and the table shows the median of the rounds with their range.
Both sides are read through their sync ``messages`` property, as ``RunnableWithMessageHistory``
reads them. Run ``python -m bench langchain`` (``make bench`` installs langchain-community).
"""

from __future__ import annotations

import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from bench._harness import redis_server
from bench.memory_append import a_turn
from convoq.integrations.langchain import ConvoqChatMessageHistory
from convoq.memory.redis import RedisConversationMemory

SIZES = (1_000, 10_000)
LAST_N = 20
ROUNDS = 5
READS_PER_ROUND = 9
BATCH_TURNS = 250


def conversation(turns: int) -> list[BaseMessage]:
    """The benchmark's conversation as LangChain messages (the same text as the other
    memory benchmarks' turns)."""
    messages: list[BaseMessage] = []
    for n in range(turns):
        user, assistant = a_turn(n)
        messages += [HumanMessage(user.text), AIMessage(assistant.text)]
    return messages


def langchain_history(url: str, cid: str) -> BaseChatMessageHistory:
    with warnings.catch_warnings():  # langchain-community warns that it is being sunset
        warnings.simplefilter("ignore", DeprecationWarning)
        from langchain_community.chat_message_histories import RedisChatMessageHistory
    return RedisChatMessageHistory(cid, url=url)


def _read_ms(read: Callable[[], list[BaseMessage]]) -> float:
    """The median of one round of reads, in ms (each read checked: N messages back)."""
    times = []
    for _ in range(READS_PER_ROUND):
        start = time.perf_counter()
        got = read()
        times.append((time.perf_counter() - start) * 1000)
        assert len(got) == LAST_N
    return statistics.median(times)


def _rounds(
    ours: Callable[[], list[BaseMessage]], theirs: Callable[[], list[BaseMessage]]
) -> tuple[list[float], list[float]]:
    mine: list[float] = []
    peer: list[float] = []
    for round_ in range(ROUNDS):
        order = [(ours, mine), (theirs, peer)]
        for read, into in order if round_ % 2 == 0 else order[::-1]:
            into.append(_read_ms(read))
    return mine, peer


def _shown(values: list[float]) -> str:
    return f"{statistics.median(values):8.3f} [{min(values):.3f}-{max(values):.3f}]"


def run() -> str:
    lines = [
        f"last {LAST_N} messages of a long chat history; ms, median [min-max] of {ROUNDS}"
        f" alternating rounds (each the median of {READS_PER_ROUND} reads)",
        f"{'turns':>8}  {'convoq last_n_messages':<30}{'langchain-community Redis':<30}ratio",
    ]
    with tempfile.TemporaryDirectory(prefix="convoq-bench-lc-") as tmp:
        (Path(tmp) / "convoq").mkdir()
        (Path(tmp) / "langchain").mkdir()
        with (
            redis_server(Path(tmp) / "convoq") as ours_url,
            redis_server(Path(tmp) / "langchain") as theirs_url,
        ):
            memory = RedisConversationMemory(ours_url, prefix="bench")
            try:
                for size in SIZES:
                    lines.append(_row(memory, theirs_url, size))
            finally:
                memory.close()
    return "\n".join(lines)


def _row(memory: RedisConversationMemory, theirs_url: str, size: int) -> str:
    cid = f"lc-{size}"
    messages = conversation(size)
    ours = ConvoqChatMessageHistory(cid, memory, last_n_messages=LAST_N)
    theirs = langchain_history(theirs_url, cid)
    step = 2 * BATCH_TURNS
    for first in range(0, len(messages), step):  # populated before any timing
        ours.add_messages(messages[first : first + step])
        theirs.add_messages(messages[first : first + step])
    assert ours.messages == messages[-LAST_N:] == theirs.messages[-LAST_N:]
    mine, peer = _rounds(lambda: ours.messages, lambda: theirs.messages[-LAST_N:])
    ratio = statistics.median(peer) / statistics.median(mine)
    return f"{size:>8}  {_shown(mine):<30}{_shown(peer):<30}{ratio:.1f}x"


def main() -> None:
    started = time.perf_counter()
    print(run())
    print(f"(took {time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()

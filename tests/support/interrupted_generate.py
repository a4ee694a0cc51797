"""A process that is interrupted (SIGINT) inside ``agent.generate`` or ``agent.stream``.

``python -m tests.support.interrupted_generate WORKDIR (generate | stream) (file | redis
URL PREFIX)``: the model writes ``WORKDIR/started`` and then takes 1.5 s. The test sends
SIGINT once the file exists. This process then waits until the model would have finished
and until nothing runs on the bridge loop any more (a turn left running there would have
been stored by then), prints how many messages conversation ``interrupted`` holds, runs
one more turn on it (its conversation must be free again) and exits 0.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

from convoq import Agent
from convoq._sync import run_sync
from convoq.memory import ConversationMemory, FileConversationMemory
from convoq.models import ModelRequest, ScriptedModel

MODEL_S = 1.5


def slow_model(workdir: Path) -> ScriptedModel:
    def answer(request: ModelRequest) -> str:
        (workdir / "started").write_text("model started")
        time.sleep(MODEL_S)
        (workdir / "model_done").write_text("the model would have answered now")
        return "a late answer"

    return ScriptedModel(answer)


def make_memory(workdir: Path, argv: list[str]) -> ConversationMemory:
    if argv[0] == "file":
        return FileConversationMemory(workdir / "conversations")
    from convoq.memory.redis import RedisConversationMemory

    return RedisConversationMemory(argv[1], prefix=argv[2])


async def _bridge_idle() -> None:
    """Return once this is the only task on the bridge loop (bounded)."""
    deadline = time.monotonic() + 10
    while len(asyncio.all_tasks()) > 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    workdir, call = Path(argv[0]), argv[1]
    memory = make_memory(workdir, argv[2:])
    agent = Agent(slow_model(workdir), memory=memory)
    try:
        if call == "stream":
            for _event in agent.stream("interrupt me", conversation_id="interrupted"):
                pass
        else:
            agent.generate("interrupt me", conversation_id="interrupted")
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    else:
        print("not interrupted", flush=True)
        return 1
    deadline = time.monotonic() + 10
    while not (workdir / "model_done").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    run_sync(_bridge_idle())
    print("stored:", len(memory.load("interrupted")), flush=True)
    quick = Agent(ScriptedModel(lambda request: "quick"), memory=memory)
    print(quick.generate("after", conversation_id="interrupted").text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

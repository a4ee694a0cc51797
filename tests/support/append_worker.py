"""Append ``count`` one-message turns to one conversation, as a separate OS process.

Usage: python append_worker.py DIRECTORY CONVERSATION_ID TAG COUNT GO_FILE

Waits until GO_FILE exists so that several workers start appending at the same moment.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from convoq.memory import FileConversationMemory
from convoq.messages import Message


def main() -> None:
    directory, conversation_id, tag, count, go_file = sys.argv[1:6]
    memory = FileConversationMemory(directory)
    deadline = time.monotonic() + 60
    while not Path(go_file).exists():
        if time.monotonic() > deadline:
            sys.exit("the start signal never came")
        time.sleep(0.005)
    for index in range(int(count)):
        memory.append(conversation_id, [Message.user(f"{tag}-{index}")])


if __name__ == "__main__":
    main()

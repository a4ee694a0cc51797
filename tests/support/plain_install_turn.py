"""Run by the Python of a venv holding only ``pip install convoq`` (no extras): start a
worker of that venv, send one turn through it and print the answer. Settings come from
the CONVOQ_* environment the test sets."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

from convoq import Client
from convoq.worker._spawn import worker_process


def main() -> int:
    log = Path(os.environ["CONVOQ_HOME"]) / "worker.log"
    with Client() as client:
        name = f"plain-{uuid.uuid4().hex[:6]}@localhost"
        with worker_process(name, dict(os.environ), log, registered=client.workers):
            handle = client.submit("plain-install", "My name is Ada.", agent="assistant")
            print(handle.wait(60).text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run by the Python of a venv holding only ``pip install convoq`` (no extras): start a
worker of that venv, send one turn through it and print the answer, then a turn with an
image (attachments through the store and back) and print whether it came back bit for bit.
Settings come from the CONVOQ_* environment the test sets."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

from convoq import Client, ImagePart, Message, TextPart
from convoq.worker._spawn import worker_process

IMAGE = bytes(range(256)) * 4  # every byte value: any base64 alphabet mix-up shows


def main() -> int:
    log = Path(os.environ["CONVOQ_HOME"]) / "worker.log"
    picture = Message(
        role="user",
        content=[TextPart(text="Look."), ImagePart(data=IMAGE, mime_type="image/png")],
    )
    with Client() as client:
        name = f"plain-{uuid.uuid4().hex[:6]}@localhost"
        with worker_process(name, dict(os.environ), log, registered=client.workers):
            handle = client.submit("plain-install", "My name is Ada.", agent="assistant")
            print(handle.wait(60).text)
            client.submit("plain-install", picture, agent="assistant").wait(60)
        stored = client.history("plain-install")[2].content[1]
        intact = isinstance(stored, ImagePart) and stored.data == IMAGE
        print("image intact" if intact else f"image changed: {stored!r:.200}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

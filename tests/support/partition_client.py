"""The client of a partition test, run as ``python -m tests.support.partition_client
PLAN.json`` inside a network namespace whose link the test cuts.

It submits the plan's turns round by round, each with an idempotency key; a submit that
fails (Redis cut off) is sent again with its key until ``submit_s`` runs out, as an
application would. Each acknowledged turn is written at once as a JSON line of the plan's
``out`` file (``{"cid", "text", "tid"}``). Then it waits for every turn to be final (a
wait that fails is retried) and writes ``{"final": tid, "status": ...}`` for each, and
``{"done": true}`` last. Settings come from the CONVOQ_* environment, as a worker's do.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from convoq import Client
from convoq.client import TurnHandle


def _submit(client: Client, cid: str, text: str, agent: str, until: float) -> TurnHandle:
    while True:
        try:
            return client.submit(cid, text, agent=agent, idempotency_key=text)
        except Exception as exc:  # Redis out of reach: the same key again
            if time.monotonic() > until:
                raise
            print(f"submit {text!r} failed, again: {type(exc).__name__}: {exc}", flush=True)
            time.sleep(0.2)


def _final(handle: TurnHandle, until: float) -> str:
    while True:
        try:
            return handle.wait(max(1.0, until - time.monotonic()), raise_on_error=False).status
        except Exception as exc:
            if time.monotonic() > until:
                return f"not final: {type(exc).__name__}"
            print(f"wait {handle.turn_id} failed, again: {type(exc).__name__}", flush=True)
            time.sleep(0.2)


def _write(out: TextIO, line: dict[str, Any]) -> None:
    out.write(json.dumps(line) + "\n")
    out.flush()


def main(plan_path: str) -> None:
    plan = json.loads(Path(plan_path).read_text())
    handles: list[TurnHandle] = []
    with Client() as client, open(plan["out"], "a", encoding="utf-8") as out:
        until = time.monotonic() + plan["submit_s"]
        for t in range(plan["turns"]):
            for cid in plan["conversations"]:
                text = f"{cid} t{t}"
                handle = _submit(client, cid, text, plan["agent"], until)
                handles.append(handle)
                _write(out, {"cid": cid, "text": text, "tid": handle.turn_id})
            time.sleep(plan["round_pause_s"])
        until = time.monotonic() + plan["wait_s"]
        for handle in handles:
            _write(out, {"final": handle.turn_id, "status": _final(handle, until)})
        _write(out, {"done": True})


if __name__ == "__main__":
    main(sys.argv[1])

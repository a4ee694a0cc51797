"""What the HTTP gateway adds to a turn, against the Python client, in one run.

One embedded Redis, one worker process (the zero-latency ``zero`` profile of
:mod:`bench.compare`), one ``convoq gateway`` process. Sequential turns on fresh
conversations, alternating between the two paths so drift hits both alike:

- Python client: ``Client.submit(...).wait()`` (the turn's event stream, in process);
- gateway: ``POST /v1/conversations/{cid}/turns`` then ``GET .../{tid}?wait=30&until=final``
  over one keep-alive HTTP connection (what a web backend in another language does).

Prints both medians and p90s, the added milliseconds and the ratio gateway / client.
Run ``python -m bench gateway`` (or ``make bench``).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import httpx

from bench.compare import ROOT, start_convoq_worker, worker_env
from convoq._ports import free_loopback_port
from convoq.client import Client
from convoq.worker._spawn import process

KEY = "bench-gateway-key-0123456789"


def _start_gateway(stack: ExitStack, env: dict[str, str], home: Path) -> str:
    port = free_loopback_port()
    keys = json.dumps([{"key": KEY, "scopes": ["submit", "read"], "name": "bench"}])
    env = {**env, "CONVOQ_GATEWAY_API_KEYS": keys}
    command = [sys.executable, "-m", "convoq.cli", "gateway", f"--port={port}"]
    stack.enter_context(process(command, env, home / "gateway.log", cwd=ROOT))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return url
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"the gateway did not start; see {home / 'gateway.log'}")


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(len(ordered) * 0.9) - 1]
    return f"median {statistics.median(samples) * 1000:6.2f} ms   p90 {p90 * 1000:6.2f} ms"


def client_turn(client: Client) -> float:
    started = time.perf_counter()
    client.submit(f"cl-{uuid.uuid4().hex[:10]}", "hi", agent="zero").wait(30)
    return time.perf_counter() - started


def gateway_turn(http: httpx.Client) -> float:
    started = time.perf_counter()
    turns = f"/v1/conversations/gw-{uuid.uuid4().hex[:10]}/turns"
    accepted = http.post(turns, json={"message": "hi", "agent": "zero"})
    tid = accepted.json()["turn_id"]
    done = http.get(f"{turns}/{tid}", params={"wait": 30, "until": "final"}).json()
    if done["status"] != "succeeded":
        raise RuntimeError(f"a gateway turn ended {done['status']}")
    return time.perf_counter() - started


def run(rounds: int = 200) -> None:
    from convoq.redis import embedded

    with tempfile.TemporaryDirectory(prefix="convoq-bench-gw-") as tmp, ExitStack() as stack:
        home = Path(tmp)
        url = embedded.embedded_url(home)
        stack.callback(embedded.stop, home)
        env = worker_env(url, f"benchgw{uuid.uuid4().hex[:6]}", home, 100)
        client = stack.enter_context(Client(url, prefix=env["CONVOQ_PREFIX"]))
        start_convoq_worker(stack, env, home, client)
        base = _start_gateway(stack, env, home)
        headers = {"Authorization": f"Bearer {KEY}"}
        http = stack.enter_context(httpx.Client(base_url=base, headers=headers, timeout=60))
        for _ in range(20):  # warm-up: connections, scripts, imports
            client_turn(client)
            gateway_turn(http)
        ours, gateway = [], []
        for _ in range(rounds):
            ours.append(client_turn(client))
            gateway.append(gateway_turn(http))
        added = (statistics.median(gateway) - statistics.median(ours)) * 1000
        ratio = statistics.median(gateway) / statistics.median(ours)
        print(f"gateway added latency per turn ({rounds} sequential turns each, alternating)")
        print(f"   Python client submit + wait     {_ms(ours)}")
        print(f"   gateway POST + GET ?wait        {_ms(gateway)}")
        print(f"   added by the gateway (median)   {added:6.2f} ms")
        print(f"   ratio gateway / client (median) {ratio:.2f}x")


def main() -> None:
    started = time.monotonic()
    run()
    print(f"\n(took {time.monotonic() - started:.0f}s)")


if __name__ == "__main__":
    main()

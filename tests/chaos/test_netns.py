"""The partition lab itself (:mod:`tests.support.netns`): each way of cutting a link
drops what it says and nothing else, a heal restores both ways, and what a killed run
left (namespaces, a process inside one, its root link) is swept by the next."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import netns
from tests.support.netns import Direction, Host, Lab
from tests.support.workers import ROOT

pytestmark = pytest.mark.slow

PORT = 47_000
RECEIVE = (
    "import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM);"
    " s.bind((sys.argv[1], int(sys.argv[2]))); s.settimeout(1.5); print('ready', flush=True)\n"
    "try: print(s.recv(100).decode(), flush=True)\n"
    "except TimeoutError: print('nothing', flush=True)"
)
SEND = (
    "import socket, sys; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
    ".sendto(b'hello', (sys.argv[1], int(sys.argv[2])))"
)


@pytest.fixture
def lab() -> Iterator[Lab]:
    ip = netns.require()
    netns.sweep_stale(ip)
    made = Lab(ip)
    try:
        yield made.open()
    finally:
        made.close()
        assert not made.leftovers(), made.leftovers()


def _in(lab: Lab, ns: str, code: str, *args: str) -> list[str]:
    return [lab.ip, "netns", "exec", ns, sys.executable, "-c", code, *args]


def _arrives(lab: Lab, host: Host) -> tuple[bool, bool]:
    """Whether a datagram gets from ``host`` to the hub, and from the hub to ``host``."""
    ends = ((lab.hub, lab.hub_address), (host.ns, host.address))
    receivers = [
        subprocess.Popen(_in(lab, ns, RECEIVE, at, str(PORT)), stdout=subprocess.PIPE, text=True)
        for ns, at in ends
    ]
    for receiver in receivers:
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
    for ns, address in ((host.ns, lab.hub_address), (lab.hub, host.address)):
        subprocess.run(_in(lab, ns, SEND, address, str(PORT)), check=True, timeout=10)
    got = [r.communicate(timeout=10)[0].strip() == "hello" for r in receivers]
    return got[0], got[1]


@pytest.mark.parametrize(
    ("direction", "to_hub", "from_hub"),
    [("both", False, False), ("to_hub", False, True), ("from_hub", True, False)],
)
def test_a_cut_drops_what_it_says_and_a_heal_restores_it(
    lab: Lab, direction: Direction, to_hub: bool, from_hub: bool
) -> None:
    host = lab.host("a")
    assert _arrives(lab, host) == (True, True)
    lab.cut(host, direction)
    assert _arrives(lab, host) == (to_hub, from_hub)
    lab.heal(host)
    assert _arrives(lab, host) == (True, True)


KILLED_RUN = """
import subprocess, sys, time
from tests.support.netns import Lab
lab = Lab(sys.argv[1]).open()
host = lab.host("left")
# A process that outlives its run: no pdeathsig, as if it had escaped the run's cleanup.
subprocess.Popen([lab.ip, "netns", "exec", host.ns, "sleep", "300"], stdout=subprocess.DEVNULL)
print(lab.tag, flush=True)
time.sleep(300)
"""


def test_what_a_killed_run_left_is_swept_by_the_next() -> None:
    ip = netns.require()
    run = subprocess.Popen([sys.executable, "-c", KILLED_RUN, ip], stdout=subprocess.PIPE,
                           text=True, cwd=ROOT)  # fmt: skip
    try:
        assert run.stdout is not None
        tag = run.stdout.readline().strip()
        assert tag, "the run did not set up its lab"
        ghost = Lab(ip, tag=tag)
        # `ip netns exec` enters the namespace a moment after the run printed its tag.
        deadline = time.monotonic() + 10
        while not (inside := _pids_in(ip, f"cq{tag}-left")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(inside) == 1 and ghost.leftovers()
    finally:
        run.kill()
        run.communicate(timeout=10)  # the process left inside has no copy of the pipe
    netns.sweep_stale(ip)  # (a test running beside this one may have swept them first)
    deadline = time.monotonic() + 10
    while ghost.leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not ghost.leftovers()
    # The process left inside was killed (by pid): gone, or a zombie until init reaps it.
    assert _ends(int(inside[0]), 10)


def _pids_in(ip: str, namespace: str) -> list[str]:
    listed = subprocess.run([ip, "netns", "pids", namespace], capture_output=True, text=True)
    return listed.stdout.split()


def _ends(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_without_root_the_partition_tests_skip_and_under_ci_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    netns.require()  # iproute2 here, so what follows is about root alone
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="need root"):
        netns.require()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="need root"):
        netns.require()

"""Linux network namespaces for partition tests, on iproute2 alone (no tc netem, no
iptables or nft: these kernels have neither).

A :class:`Lab` is one run's network. A *hub* namespace holds a bridge with the hub
address, where the test starts redis-server; each *host* (a worker, a client) is a
namespace of its own joined to the bridge by a veth pair; the test process itself reaches
the hub through one more veth pair that is never cut. Addresses come from one /24 of
198.18.0.0/15 (the benchmarking range) that no interface of this machine uses.

Links are cut three ways, each undone by :meth:`Lab.heal`:

- ``both``: the hub end of the host's veth goes down; frames either way are dropped.
- ``to_hub``: the host's neighbour entry for the hub address is pinned to a MAC no one
  has, so what the host sends is dropped by the bridge's other ports, silently; what the
  hub sends still arrives.
- ``from_hub``: the hub's entry for the host's address is pinned the same way: replies
  to the host are dropped, what it sends still arrives.

Names carry the creating process id (``cq{pid:06x}{n:x}-...``): :func:`sweep_stale`
removes what a killed earlier run left (its processes, killed by pid, then its
namespaces). Processes started in a namespace get SIGKILL when the thread that started
them ends (``setpriv --pdeathsig``), so a test killed mid-run leaves no worker running.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import random
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Literal

from tests.support import services

Direction = Literal["both", "to_hub", "from_hub"]

RANGE = ipaddress.ip_network("198.18.0.0/15")
BOGUS_MAC = "02:00:00:c0:ff:ee"  # locally administered; no interface here has it
_NAME = re.compile(r"^cq([0-9a-f]{6})[0-9a-f]")
_runs = itertools.count()


def ip_binary() -> str | None:
    return shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip") if os.access(p, os.X_OK)), None
    )


def require() -> str:
    """The ``ip`` binary, once root and ``ip netns`` are known to work; else skip (fail
    under CI=true, see :mod:`tests.support.services`)."""
    ip = ip_binary()
    if ip is None:
        services.missing("no ip command: partition tests need iproute2 (apt-get install -y"
                         " iproute2)")  # fmt: skip
    if os.geteuid() != 0:
        services.missing("partition tests need root: they create network namespaces")
    probe = f"cq{os.getpid():06x}f-probe"
    made = subprocess.run([ip, "netns", "add", probe], capture_output=True, text=True)
    subprocess.run([ip, "netns", "del", probe], capture_output=True)
    if made.returncode != 0:
        services.missing(f"ip netns does not work here: {made.stderr.strip()}")
    if shutil.which("setpriv") is None:
        services.missing("no setpriv command (util-linux): apt-get install -y util-linux")
    return ip


def _run(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _try(*args: str) -> None:
    subprocess.run(args, capture_output=True, timeout=30)


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _kill_inside(ip: str, ns: str) -> None:
    """SIGKILL, by pid, every process still in ``ns`` (they are the run's own)."""
    done = subprocess.run([ip, "netns", "pids", ns], capture_output=True, text=True)
    for pid in done.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def sweep_stale(ip: str) -> list[str]:
    """Remove the namespaces and root links of runs whose process is gone."""
    removed = []
    names = _run(ip, "netns", "list").split("\n")
    for ns in (line.split(" ")[0] for line in names if line.strip()):
        match = _NAME.match(ns)
        if match and not _alive(int(match.group(1), 16)):
            _kill_inside(ip, ns)
            _try(ip, "netns", "del", ns)
            removed.append(ns)
    for line in _run(ip, "-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        match = _NAME.match(name)
        if match and not _alive(int(match.group(1), 16)):
            _try(ip, "link", "del", name)
            removed.append(name)
    return removed


def _free_subnet(ip: str) -> ipaddress.IPv4Network:
    used = _run(ip, "-4", "-o", "addr", "show") + _run(ip, "-4", "route", "show", "table", "all")
    taken = {
        ipaddress.ip_network(f"{m}/24", strict=False)
        for m in re.findall(r"\b(198\.1[89]\.\d+\.\d+)", used)
    }
    choices = [n for n in RANGE.subnets(new_prefix=24) if n not in taken]
    return random.choice(choices)


@dataclass
class Host:
    """One namespace on the lab's bridge: ``address`` inside it, ``port`` its veth's hub
    end (what ``both`` takes down)."""

    name: str
    ns: str
    address: str
    port: str
    cut: Direction | None = None

    def run_prefix(self, ip: str) -> list[str]:
        """What runs a command inside the namespace (SIGKILLed if its starter ends)."""
        return ["setpriv", "--pdeathsig", "KILL", "--", ip, "netns", "exec", self.ns]


@dataclass
class Lab:
    """One run's namespaces and links; :meth:`close` removes all of them."""

    ip: str
    tag: str = field(default_factory=lambda: f"{os.getpid():06x}{next(_runs) % 16:x}")
    hosts: dict[str, Host] = field(default_factory=dict)
    subnet: ipaddress.IPv4Network | None = None

    @property
    def hub(self) -> str:
        return f"cq{self.tag}-hub"

    @property
    def root_link(self) -> str:
        return f"cq{self.tag}t"

    def _address(self, index: int) -> str:
        assert self.subnet is not None
        return str(self.subnet.network_address + index)

    @property
    def hub_address(self) -> str:
        return self._address(1)

    def open(self) -> Lab:
        """The hub namespace, its bridge and the test process's own link to it."""
        ip, hub = self.ip, self.hub
        self.subnet = _free_subnet(ip)
        _run(ip, "netns", "add", hub)
        _run(ip, "-n", hub, "link", "set", "lo", "up")
        _run(ip, "-n", hub, "link", "add", "br0", "type", "bridge")
        _run(ip, "-n", hub, "addr", "add", f"{self.hub_address}/24", "dev", "br0")
        _run(ip, "-n", hub, "link", "set", "br0", "up")
        _run(ip, "link", "add", self.root_link, "type", "veth", "peer", "name", "t0",
             "netns", hub)  # fmt: skip
        self._join("t0")
        here = f"{self._address(2)}/32"
        _run(ip, "addr", "add", here, "peer", f"{self.hub_address}/32", "dev", self.root_link)
        _run(ip, "link", "set", self.root_link, "up")
        return self

    def _join(self, port: str) -> None:
        _run(self.ip, "-n", self.hub, "link", "set", port, "master", "br0")
        _run(self.ip, "-n", self.hub, "link", "set", port, "up")

    def host(self, name: str) -> Host:
        """A new namespace ``name`` joined to the hub by its own veth pair."""
        ip = self.ip
        host = Host(name, f"cq{self.tag}-{name}", self._address(10 + len(self.hosts)),
                    f"p-{name}")  # fmt: skip
        _run(ip, "netns", "add", host.ns)
        _run(ip, "-n", host.ns, "link", "set", "lo", "up")
        _run(ip, "link", "add", "eth0", "netns", host.ns, "type", "veth", "peer", "name",
             host.port, "netns", self.hub)  # fmt: skip
        self._join(host.port)
        _run(ip, "-n", host.ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _run(ip, "-n", host.ns, "link", "set", "eth0", "up")
        self.hosts[name] = host
        return host

    def cut(self, host: Host, direction: Direction = "both") -> None:
        """Drop what ``host`` and the hub send each other (``both``), or one way only."""
        self.heal(host)
        if direction == "both":
            _run(self.ip, "-n", self.hub, "link", "set", host.port, "down")
        elif direction == "to_hub":
            self._pin(host.ns, self.hub_address, "eth0")
        else:
            self._pin(self.hub, host.address, "br0")
        host.cut = direction

    def _pin(self, ns: str, address: str, dev: str) -> None:
        _run(self.ip, "-n", ns, "neigh", "replace", address, "lladdr", BOGUS_MAC, "dev", dev,
             "nud", "permanent")  # fmt: skip

    def heal(self, host: Host) -> None:
        """Undo :meth:`cut` (a no-op for a host whose link is whole)."""
        if host.cut == "both":
            _run(self.ip, "-n", self.hub, "link", "set", host.port, "up")
        elif host.cut == "to_hub":
            _try(self.ip, "-n", host.ns, "neigh", "del", self.hub_address, "dev", "eth0")
        elif host.cut == "from_hub":
            _try(self.ip, "-n", self.hub, "neigh", "del", host.address, "dev", "br0")
        host.cut = None

    def close(self) -> None:
        """Kill what still runs in the lab's namespaces (by pid), then remove them all."""
        for ns in [*(h.ns for h in self.hosts.values()), self.hub]:
            _kill_inside(self.ip, ns)
        _try(self.ip, "link", "del", self.root_link)  # its peer goes with it
        for ns in [*(h.ns for h in self.hosts.values()), self.hub]:
            _try(self.ip, "netns", "del", ns)
        self.hosts.clear()

    def leftovers(self) -> list[str]:
        """Namespaces and links of this lab still present (none after :meth:`close`)."""
        names = _run(self.ip, "netns", "list") + _run(self.ip, "-o", "link", "show")
        return sorted(set(re.findall(rf"\bcq{self.tag}[-\w]*", names)))

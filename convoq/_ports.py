"""A free loopback TCP port for a server convoq starts itself (the embedded Redis when its
socket path is too long, the demo gateway), and for the test and benchmark servers.

The usual trick, binding port 0 and closing, hands out a port from the kernel's ephemeral
range: the same range every outgoing connection takes its local port from. Between the
pick and the server's bind, any client connecting anywhere can take that port, and a
server killed and started again on its port (a Redis restart) can find it gone. Ports
picked here sit below the ephemeral range, where no outgoing connection lands, and are
never handed out twice in one process.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

__all__ = ["free_loopback_port"]

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Below this, ports belong to well-known services (and many systems reserve them).
_LOWEST = 10_000
_ATTEMPTS = 200

_handed_out: set[int] = set()
_lock = threading.Lock()


def free_loopback_port() -> int:
    """A port nothing listens on at 127.0.0.1, outside the ephemeral range when the
    system says where that is (else one the kernel picks)."""
    low, high = _outside_ephemeral()
    with _lock:
        if high > low:
            rng = random.SystemRandom()
            for _ in range(_ATTEMPTS):
                port = rng.randrange(low, high)
                if port not in _handed_out and _bindable(port):
                    _handed_out.add(port)
                    return port
        for _ in range(_ATTEMPTS):
            port = _kernel_pick()
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise OSError("no free loopback port found")  # pragma: no cover  (every port in use)


def _outside_ephemeral() -> tuple[int, int]:
    """[low, high): the ports between the well-known ones and the ephemeral range."""
    try:
        first = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return (0, 0)
    return (_LOWEST, first)


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_pick() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])

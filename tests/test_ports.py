"""free_loopback_port: ports no outgoing connection can take, never handed out twice."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from convoq import _ports
from convoq._ports import free_loopback_port

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    if not RANGE.exists():
        pytest.skip("this system does not say where its ephemeral range is")
    low = int(RANGE.read_text().split()[0])
    if low < 11_000:
        pytest.skip(f"the ephemeral range starts at {low}: no room below it")
    return low


def test_ports_sit_below_the_ephemeral_range_distinct_and_bindable() -> None:
    low = _ephemeral_low()
    ports = [free_loopback_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(10_000 <= port < low for port in ports)
    with socket.socket() as server:
        server.bind(("127.0.0.1", ports[-1]))  # a server can take it
        server.listen()


def test_outgoing_connections_never_land_on_the_ports_handed_out() -> None:
    low = _ephemeral_low()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        address = listener.getsockname()
        clients = [socket.create_connection(address) for _ in range(64)]
        try:
            local_ports = {client.getsockname()[1] for client in clients}
        finally:
            for client in clients:
                client.close()
    assert min(local_ports) >= low  # the range ports are picked from is never used


def test_a_port_in_use_or_already_handed_out_is_not_handed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    low = _ephemeral_low()
    monkeypatch.setattr(_ports, "_handed_out", {low - 3})
    # Three candidates: one handed out before, one a server holds, one free.
    monkeypatch.setattr(_ports, "_outside_ephemeral", lambda: (low - 3, low))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", low - 2))
        busy.listen()
        assert free_loopback_port() == low - 1


def test_without_a_known_range_the_kernel_picks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_ports, "_EPHEMERAL_RANGE", tmp_path / "absent")
    ports = {free_loopback_port() for _ in range(20)}
    assert len(ports) == 20
    assert all(port > 0 for port in ports)

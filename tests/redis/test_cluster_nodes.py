"""The test cluster's own start-up: a node whose port something else took moves to
another port, and a cluster that cannot start leaves no process behind."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support import services
from tests.support.redis_cluster import RedisClusterNodes


def test_a_node_whose_port_is_taken_moves_to_another_port(tmp_path: Path) -> None:
    nodes = RedisClusterNodes(tmp_path / "nodes", services.redis_cli())
    taken = nodes.ports[2]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        try:
            nodes.start()
            assert taken not in nodes.ports and len(set(nodes.ports)) == 6
            client = nodes.client()
            try:
                client.set("k", "v")
                assert client.get("k") == b"v"
            finally:
                client.close()
        finally:
            nodes.stop()


def test_a_cluster_that_cannot_start_stops_the_nodes_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = RedisClusterNodes(tmp_path / "nodes", services.redis_cli())
    started = []
    start_node = nodes._start_node

    def record(port: int) -> None:
        start_node(port)
        started.append(nodes.processes[port])

    monkeypatch.setattr(nodes, "_start_node", record)
    monkeypatch.setattr(nodes, "cli", str(tmp_path / "no-redis-cli"))  # the join fails
    with pytest.raises(OSError):
        nodes.start()
    assert len(started) == 6 and all(p.poll() is not None for p in started)
    assert nodes.processes == {}

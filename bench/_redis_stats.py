"""What a Redis spent: command time (``INFO commandstats``), its process CPU (``INFO
cpu``) and memory (``INFO memory``), summed over the nodes asked; and the history bytes of
sample conversations (``MEMORY USAGE``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import redis
from redis.cluster import ClusterNode, RedisCluster

from convoq.redis.keys import KeySchema


@dataclass(frozen=True)
class Usage:
    command_us: float  # microseconds spent executing commands (scripts included)
    cpu_s: float  # user + system CPU of the server processes
    memory: int  # used_memory bytes
    by_command: Counter[str] = field(default_factory=Counter)  # usec per command name

    def __sub__(self, other: Usage) -> Usage:
        by_command = Counter(self.by_command)
        by_command.subtract(other.by_command)
        return Usage(
            self.command_us - other.command_us,
            self.cpu_s - other.cpu_s,
            self.memory - other.memory,
            by_command,
        )


def usage(url: str, ports: list[int]) -> Usage:
    """The sum over the servers on ``ports`` (none given: the server of ``url``)."""
    ports = ports or [urlsplit(url).port or 6379]
    total = Usage(0.0, 0.0, 0)
    by_command: Counter[str] = Counter()
    for port in ports:
        r = redis.Redis(host="127.0.0.1", port=port)
        try:
            stats = r.info("commandstats")
            cpu = r.info("cpu")
            memory = r.info("memory")
        finally:
            r.close()
        for name, v in stats.items():
            if isinstance(v, dict):
                by_command[name.removeprefix("cmdstat_")] += float(v["usec"])
        command_us = sum(float(v["usec"]) for v in stats.values() if isinstance(v, dict))
        cpu_s = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
        total = Usage(
            total.command_us + command_us,
            total.cpu_s + cpu_s,
            total.memory + int(memory["used_memory"]),
        )
    return Usage(total.command_us, total.cpu_s, total.memory, by_command)


def history_bytes(url: str, prefix: str, conversations: list[str]) -> float:
    """Bytes per stored turn of the history alone (turns list, meta), averaged over
    ``conversations``: what stays once turn records and event streams expired."""
    keys = KeySchema(prefix)
    client = _client(url)
    try:
        stored = turns = 0
        for cid in conversations:
            for key in (keys.turns(cid), keys.meta(cid)):
                stored += int(client.memory_usage(key, samples=0) or 0)
            turns += int(client.llen(keys.turns(cid)))
    finally:
        client.close()
    return stored / turns if turns else 0.0


def _client(url: str) -> redis.Redis:
    if not url.startswith("redis+cluster://"):
        return redis.Redis.from_url(url)
    nodes = [item.rsplit(":", 1) for item in url.removeprefix("redis+cluster://").split(",")]
    cluster = RedisCluster(startup_nodes=[ClusterNode(host, int(port)) for host, port in nodes])
    return cluster  # type: ignore[return-value]

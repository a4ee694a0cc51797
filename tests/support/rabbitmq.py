"""The RabbitMQ broker at 127.0.0.1:5672 (guest/guest) that AMQP tests use when it runs
(named so that it never shadows the `amqp` package for scripts run from this folder)."""

from __future__ import annotations

import socket

from tests.support.workers import WorkerPool

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


def amqp_listening(port: int = 5672) -> bool:
    """Whether something accepts connections on the RabbitMQ port."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def delete_amqp_queues(pool: WorkerPool) -> None:
    """Delete the pool's partition queues (RabbitMQ keeps them after the test)."""
    from kombu import Connection

    with Connection(AMQP_URL) as conn:
        channel = conn.default_channel
        for index in range(pool.partitions):
            channel.queue_delete(f"{pool.prefix}.p{index}")

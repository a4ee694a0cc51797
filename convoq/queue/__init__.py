"""The queue contract: what the client and the workers agree on, below both of them.

- :mod:`convoq.queue.routing`: task names, the queue of a conversation, partitions.
- :mod:`convoq.queue.transport`: the broker URL, the Celery settings both sides share, the
  kick and its header.
- :mod:`convoq.queue.signing`: the webhook payload and its HMAC signature.

The client and the worker import this package and never each other.
"""

from convoq.queue.routing import parse_partitions, partition_of, route
from convoq.queue.signing import SIGNATURE_HEADER, sign, verify_signature

__all__ = [
    "SIGNATURE_HEADER",
    "parse_partitions",
    "partition_of",
    "route",
    "sign",
    "verify_signature",
]

"""Where work goes: the queue of a conversation, partition ranges, task names.

Queues are keyed by conversation id so every kick for one conversation lands on the same
queue: ``{prefix}.p{crc32(cid) % partitions}`` (``convoq.p3`` with the default prefix).
The prefix is part of the queue name so deployments (and tests) that share one broker
never consume each other's kicks. Pure: the client and the workers both import it.
"""

from __future__ import annotations

import zlib

from convoq import defaults
from convoq.errors import ConfigurationError
from convoq.ids import check_conversation_id

DRAIN_TASK = "convoq.drain"
RESUME_TASK = "convoq.resume"
DELIVER_CALLBACK_TASK = "convoq.deliver_callback"
SWEEP_TASK = "convoq.sweep"
COMPACT_TASK = "convoq.compact"


def partition_of(conversation_id: str, partitions: int) -> int:
    """The partition a conversation belongs to: ``crc32(cid) % partitions``."""
    check_conversation_id(conversation_id)
    if partitions < 1:
        raise ConfigurationError(f"partitions must be >= 1, not {partitions}")
    return zlib.crc32(conversation_id.encode()) % partitions


def queue_name(prefix: str, partition: int, pool: str | None = None) -> str:
    """The Celery queue of one partition, e.g. ``convoq.p3`` (of the pool ``billing``:
    ``convoq.billing.p3``)."""
    return f"{prefix}.{pool}.p{partition}" if pool else f"{prefix}.p{partition}"


def route(
    conversation_id: str,
    *,
    prefix: str = defaults.PREFIX,
    partitions: int = defaults.PARTITIONS,
    pool: str | None = None,
) -> str:
    """The Celery queue that kicks for ``conversation_id`` are sent to (on ``pool``'s
    queues when given: the pool that serves the agent its head turn runs on)."""
    return queue_name(prefix, partition_of(conversation_id, partitions), pool)


def parse_partitions(spec: str | None, partitions: int) -> list[int]:
    """Parse ``"0-7"``, ``"1,3,5"`` or ``"0-3,8,10-11"``; ``None``/``"all"`` means all.

    Raises:
        ConfigurationError: a malformed spec or a partition outside ``0..partitions-1``.
    """
    if spec is None or spec.strip().lower() in ("", "all"):
        return list(range(partitions))
    chosen: set[int] = set()
    for item in spec.split(","):
        chosen.update(_parse_item(item.strip(), spec))
    outside = sorted(p for p in chosen if not 0 <= p < partitions)
    if outside:
        raise ConfigurationError(
            f"partitions {_ranges(outside)} do not exist: there are {partitions}"
            f" (0-{partitions - 1});"
            " change --partitions or CONVOQ_PARTITIONS",
            spec=spec,
        )
    return sorted(chosen)


def _ranges(numbers: list[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3,7"`` (sorted input)."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


def _parse_item(item: str, spec: str) -> range:
    low, sep, high = item.partition("-")
    try:
        first = int(low)
        last = int(high) if sep else first
    except ValueError:
        raise ConfigurationError(
            f"invalid partition spec {spec!r}: use ranges and lists like 0-7 or 1,3,5-6",
            spec=spec,
        ) from None
    if last < first:
        raise ConfigurationError(f"invalid partition range {item!r}: {first} > {last}", spec=spec)
    return range(first, last + 1)


def queue_names(prefix: str, chosen: list[int], pool: str | None = None) -> list[str]:
    """The queue names of the chosen partitions, in order (of ``pool``, when given)."""
    return [queue_name(prefix, p, pool) for p in chosen]

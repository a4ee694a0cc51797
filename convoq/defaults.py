"""The embedded defaults: the one place each default value is written.

Every entry point resolves a setting the same way (:meth:`convoq.settings.ConvoqSettings.resolve`):
an explicit argument, else the ``CONVOQ_*`` variable, else the value here. Library classes
that take a setting as an argument default to these same values, so a client and a worker
started in one environment agree.
"""

from __future__ import annotations

from pathlib import Path

MiB = 1024 * 1024

PREFIX = "convoq"
"""Prefix of every Redis key and Celery queue (``CONVOQ_PREFIX``)."""
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
"""URL schemes of a Redis Cluster (plain, TLS): ``redis+cluster://host:port[,host:port...]``."""
SENTINEL_SCHEMES = ("redis+sentinel",)
"""URL scheme of a Redis served by Sentinel:
``redis+sentinel://host:port[,host:port...]/service_name[/db]``."""
PARTITIONS = 16
"""Queues ``{prefix}.p0`` .. ``p{N-1}``; kicks go to ``crc32(cid) % N`` (``CONVOQ_PARTITIONS``)."""
HOME = Path(".convoq")
"""Where the embedded redis-server lives when no Redis URL is set (``CONVOQ_HOME``)."""
CONCURRENCY = 32
"""Turns in flight per worker process (``CONVOQ_CONCURRENCY``)."""
LEASE_MS = 10_000
"""A conversation's lease; renewed every third of it while a turn runs (``CONVOQ_LEASE_MS``)."""
MAX_TURN_S = 900.0
"""A run of a turn longer than this is stopped and failed (``CONVOQ_MAX_TURN_S``)."""
SHUTDOWN_GRACE_S = 10.0
"""Warm shutdown: how long running turns may go on before they are handed back to other
workers (``CONVOQ_SHUTDOWN_GRACE_S``)."""
MAX_ATTEMPTS = 5
"""Runs of one turn whose worker died (never came back to say what happened to the run)
before it fails (``CONVOQ_MAX_ATTEMPTS``)."""
MAX_CUT_OFFS = 50
"""Runs of one turn cut off from Redis (their worker lost the lease, lived, and reported
it once Redis answered again) before it fails (``CONVOQ_MAX_CUT_OFFS``): a bound apart
from max attempts, so a flapping network does not fail a turn that a crash budget of 5
would."""
APPROVAL_TTL_S = 86_400
"""How long a parked turn waits for its decisions (``CONVOQ_APPROVAL_TTL_S``)."""
SUBAGENT_MAX_DEPTH = 3
"""How deep sub-agent calls may nest (``CONVOQ_SUBAGENT_MAX_DEPTH``)."""
SUBAGENT_MAX_FANOUT = 8
"""Sub-agent calls one model step may make (``CONVOQ_SUBAGENT_MAX_FANOUT``)."""
MAX_HANDOFFS = 5
"""Handoffs one turn may make (``CONVOQ_MAX_HANDOFFS``)."""
TURN_TTL_S = 7 * 86_400
"""How long finished turn records and their events are kept (``CONVOQ_TURN_TTL_S``)."""
CONVERSATION_TTL_S: int | None = None
"""Idle TTL of a conversation on Redis, refreshed by each turn; None keeps conversations
until deleted (``CONVOQ_CONVERSATION_TTL_S``)."""
SWEEP_INTERVAL_S = 5.0
"""How often one worker re-kicks stranded conversations (``CONVOQ_SWEEP_INTERVAL_S``)."""
TIMER_INTERVAL_S = 0.5
"""How often each worker process fires due timers of scheduled turns
(``CONVOQ_TIMER_INTERVAL_S``): a scheduled turn is queued at most this late."""
VISIBILITY_TIMEOUT_S = 3600
TASK_EVENTS = False
"""Celery task events from the start (``CONVOQ_TASK_EVENTS``): each costs a Redis PUBLISH
per task state; Flower switches them on in running workers itself."""
"""Redis broker: an unacked kick is redelivered after this long."""
FAST_PATHS = True
"""convoq's shortcuts into redis-py, kombu and Celery internals (``CONVOQ_FAST_PATHS``):
see :func:`convoq.settings.fast_paths`."""
EVENT_FLUSH_MS = 10
"""How long a turn event may wait for the turn's next write before it goes on its own."""
MIN_REPLICAS_ACKED = 0
"""Replicas that must confirm a submit, commit, fail or park before it is acknowledged (WAIT);
0 acknowledges once the primary has it (``CONVOQ_MIN_REPLICAS_ACKED``)."""
REPLICA_ACK_TIMEOUT_MS = 1000
"""How long a write waits for those replicas before it is reported not durable
(``CONVOQ_REPLICA_ACK_TIMEOUT_MS``)."""
MAX_ATTACHMENT_BYTES = 20 * MiB
"""Largest attachment accepted (``CONVOQ_MAX_ATTACHMENT_BYTES``)."""
MAX_TURN_BYTES = 64 * MiB
"""Largest turn (messages plus attachments) accepted (``CONVOQ_MAX_TURN_BYTES``)."""
DECODED_CACHE_BYTES = 64 * MiB
"""Decoded stored turns a process keeps, shared by every read of them
(``CONVOQ_DECODED_CACHE_BYTES``; 0 keeps none): a worker's windows, repeated loads."""
DELTA_FLUSH_MS = 50
"""Streamed text waits at most this long before it is written to the turn's event stream
as one ``text_delta`` event (``CONVOQ_DELTA_FLUSH_MS``)."""
DELTA_FLUSH_BYTES = 1024
"""Streamed text of this many bytes is written at once (``CONVOQ_DELTA_FLUSH_BYTES``)."""
MAX_QUEUED_PER_CONVERSATION: int | None = 1000
"""Turns one conversation may have waiting (its inbox, the running one included) before
``submit`` raises QueueFullError (``CONVOQ_MAX_QUEUED_PER_CONVERSATION``; 0 or unset:
no limit). A conversation runs one turn at a time, so a thousand queued turns is a client
far ahead of the workers (minutes of backlog at least); the check is free (in the
``submit`` script)."""
MAX_QUEUED_PER_AGENT: int | None = None
"""Turns queued, running or parked for one agent profile across all conversations
(``CONVOQ_MAX_QUEUED_PER_AGENT``; 0 or unset: no limit). Off by default: the right value
depends on the workers' capacity, and it costs a round trip on submit and on finish."""
MAX_QUEUED_TOTAL: int | None = None
"""Turns queued, running or parked in the whole deployment (``CONVOQ_MAX_QUEUED_TOTAL``;
0 or unset: no limit). Off by default, like the per-agent limit; set it from the Redis
memory you give to waiting turns (each holds its input until it runs)."""
QUEUE_FULL_RETRY_AFTER_S = 1.0
"""The retry-after hint of a QueueFullError (and the gateway's ``Retry-After``)."""

SIGNAL_MAX_KEPT = 100
"""Signals of one name a conversation keeps for its next wait on it (more are refused)."""

SIGNAL_TTL_S = 24 * 3600
"""How long a kept signal waits for a turn to wait for it (and a signal id is remembered)."""

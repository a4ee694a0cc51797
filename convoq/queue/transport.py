"""The Celery side of the queue contract: the broker (its URL, transport options and TLS,
read from the Redis URL by :mod:`convoq.queue._broker`), the Celery settings every convoq
app shares (sender or worker), a Celery app that only sends (no task code is needed to
kick a conversation), the kick itself and its message header.

A kick is normally sent with Celery's ``send_task``. Where the broker is the store's own
Redis, :func:`kick_message` builds the very message kombu's Redis transport would write
(a JSON document ``LPUSH``-ed onto the queue's list) and the store's ``submit`` script
pushes it in the same call that queues the turn: one round trip, no ``send_task``.

That message is a fenced shortcut: it copies Celery's task message protocol 2 and kombu's
Redis transport envelope, checked with the releases in :data:`CHECKED_WITH` (a test
compares it field by field with what ``send_task`` writes). With ``CONVOQ_FAST_PATHS``
off, or a Celery or kombu outside those releases, :func:`direct_kicks` answers False and
every kick goes through ``send_task``.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import os
import re
import socket
import uuid
from typing import Any
from urllib.parse import urlsplit

from celery import Celery

from convoq import defaults
from convoq.errors import ConfigurationError
from convoq.observe import tracing
from convoq.queue._broker import Broker as Broker
from convoq.queue._broker import broker_for as broker_for
from convoq.queue._broker import broker_url_for as broker_url_for
from convoq.settings import fast_path

CHECKED_WITH = (("celery", ">=5.4,<5.8"), ("kombu", ">=5.4,<5.8"))
"""The Celery and kombu releases :func:`kick_message` was checked with: outside them
:func:`direct_kicks` answers False (and says so once in the log)."""

# The kick of a turn that went to an idle conversation names it in this message header:
# the worker then takes it without reading the inbox head first (a hint, checked there).
HEAD_HEADER = "convoq_head"
# A drain that gave its slot up kept the conversation's lease for the drain its kick
# starts: the kick carries the lease's fence in this header (proof of ownership).
FENCE_HEADER = "convoq_fence"
log = logging.getLogger("convoq.client")


def celery_base_config(
    broker: Broker | str,
    *,
    visibility_timeout_s: int = defaults.VISIBILITY_TIMEOUT_S,
    task_events: bool = defaults.TASK_EVENTS,
) -> dict[str, Any]:
    """Settings every convoq Celery app shares, sender or worker: JSON only, no results;
    the broker's URL, transport options and TLS (``broker``: as :func:`broker_for` gives
    it, or a URL read by it with the default bounds); ``task_events``: a sender also
    publishes a "task-sent" event per kick (Flower)."""
    if isinstance(broker, str):
        broker = broker_for(broker)
    config = {
        "broker_url": broker.url,
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "result_backend": None,
        # The turn record in Redis is the result; Celery stores none.
        "task_ignore_result": True,
        "task_send_sent_event": task_events,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {
            "visibility_timeout": visibility_timeout_s,
            **broker.transport_options,
        },
        "task_create_missing_queues": True,
    }
    connect_s = broker.transport_options.get("socket_connect_timeout")
    if connect_s:
        config["broker_connection_timeout"] = connect_s
    if broker.use_ssl is not None:
        config["broker_use_ssl"] = broker.use_ssl
    return config


def sender_app(
    broker: Broker | str,
    *,
    visibility_timeout_s: int = defaults.VISIBILITY_TIMEOUT_S,
    task_events: bool = defaults.TASK_EVENTS,
) -> Celery:
    """A Celery app that only sends tasks by name (``send_task``) to convoq's queues."""
    app = Celery("convoq-client", set_as_current=False)
    config = celery_base_config(
        broker, visibility_timeout_s=visibility_timeout_s, task_events=task_events
    )
    app.conf.update(config)
    return app


async def send_kick(
    app: Celery, task: str, queue: str, args: list[str], *, head: str | None = None
) -> None:
    """Send ``task`` by name to ``queue`` (``head``: the turn heading the inbox, as a hint).
    A failed send is logged, not raised: the turn is stored, and the sweeper re-kicks
    queued conversations without a lease."""
    with tracing.span("convoq.kick", {"messaging.destination.name": queue, "convoq.task": task}):
        # The kick's trace context rides in the headers: the worker's drain continues it.
        headers = tracing.carrier()
        if head is not None:
            headers[HEAD_HEADER] = head
        try:
            await asyncio.to_thread(
                app.send_task, task, args=args, queue=queue, headers=headers or None
            )
        except Exception as exc:
            tracing.record_error(exc)
            log.warning(
                "could not send %s for %s (%s); the sweeper will pick it up", task, args[0], exc
            )


# What kombu writes for a task message of protocol 2 (celery.app.amqp.as_task_v2 and
# kombu.transport.virtual.Channel): arguments, no kwargs, no callbacks or chains.
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
# send_task's `reply_to` is its app's per-process id; a task ignoring its result never
# uses it, but the field is there in every message Celery sends.
_REPLY_TO = str(uuid.uuid4())
# The host in Celery's origin header, gen<pid>@<host> (celery.utils.nodenames.anon_nodename).
_HOST = socket.gethostname()


def direct_kicks(
    redis_url: str,
    broker_url: str | None,
    *,
    task_events: bool,
    fast_paths_on: bool | None = None,
) -> bool:
    """Whether the store's scripts can push kicks themselves: the fast paths are on
    (``fast_paths_on``, else ``CONVOQ_FAST_PATHS``), the broker is the store's Redis (no
    broker URL of its own, or the store's very URL: same server, same database), the store
    is one Redis (``redis://``, ``rediss://``, the embedded server's ``unix://``, or the
    primary a ``redis+sentinel://`` URL names; not a cluster), no "task-sent" event is
    wanted (only ``send_task`` publishes one), and Celery and kombu are releases of
    :data:`CHECKED_WITH`."""
    scheme = urlsplit(redis_url).scheme.lower()
    same = not broker_url or broker_url == redis_url
    one_redis = scheme in ("redis", "rediss", "unix", *defaults.SENTINEL_SCHEMES)
    wanted = same and one_redis and not task_events
    return wanted and fast_path("template kick", CHECKED_WITH, fast_paths_on)


def kick_message(task: str, queue: str, args: list[str], *, head: str | None = None) -> str:
    """The message ``send_task(task, args=args, queue=queue)`` puts on a kombu Redis
    broker, as the JSON kombu ``LPUSH``-es onto the list named ``queue`` (priority 0;
    ``head``: the :data:`HEAD_HEADER` hint). A Celery worker consuming ``queue`` cannot
    tell it from one ``send_task`` sent."""
    task_id = str(uuid.uuid4())
    body = "[[" + ", ".join(map(_quoted, args)) + "], {}, " + _EMBED_JSON + "]"
    values = {
        "id": task_id,
        "args": repr(args),
        "body": base64.b64encode(body.encode()).decode(),
        "queue": queue,
        "tag": str(uuid.uuid4()),
        "head": head or "",
    }
    parts = _template(task, head is not None, os.getpid())
    # Even items are JSON text, odd ones the names of the values quoted in between.
    return "".join(part if i % 2 == 0 else _quoted(values[part]) for i, part in enumerate(parts))


_EMBED_JSON = json.dumps(_EMBED)
# A JSON string literal, as json.dumps writes it.
_quoted = json.encoder.encode_basestring_ascii
_SLOT = re.compile(r'"@(\w+)@"')


@functools.cache
def _template(task: str, with_head: bool, pid: int) -> list[str]:
    """The kick's JSON split around its per-message values (``"@name@"`` slots): built
    once per task and process, filled in per message by :func:`kick_message`."""
    headers: dict[str, Any] = {
        "lang": "py",
        "task": task,
        "id": "@id@",
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": "@id@",
        "parent_id": None,
        "argsrepr": "@args@",
        "kwargsrepr": "{}",
        "origin": f"gen{pid}@{_HOST}",
        "ignore_result": None,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
    }
    if with_head:
        headers[HEAD_HEADER] = "@head@"
    properties = {
        "correlation_id": "@id@",
        "reply_to": _REPLY_TO,
        "delivery_mode": 2,
        "delivery_info": {"exchange": "", "routing_key": "@queue@"},
        "priority": 0,
        "body_encoding": "base64",
        "delivery_tag": "@tag@",
    }
    message = {
        "body": "@body@",
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": properties,
    }
    return _SLOT.split(json.dumps(message))


async def broker_reachable(app: Celery, timeout_s: float) -> None:
    """Connect to ``app``'s broker once, bounded by ``timeout_s``.

    Raises:
        ConfigurationError: the broker did not answer (the reason is named).
    """

    def attempt() -> None:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=max(1, int(timeout_s)))

    try:
        # The thread is abandoned if kombu ignores its timeout: the caller's wait is bounded.
        await asyncio.wait_for(asyncio.to_thread(attempt), timeout_s + 1)
    except Exception as exc:
        raise ConfigurationError(f"the broker does not answer: {exc!r}"[:300]) from None

"""The Celery app of convoq workers: ``celery -A convoq.worker.app:app worker`` or
``convoq worker``.

Configured for this job: JSON only; no result backend (the turn record in Redis is the
result); ``acks_late`` + ``reject_on_worker_lost`` so a kick is not lost with a dying
worker (with the fast paths on, kombu's ack emulation on a Redis broker is off: a killed
worker's kicks are gone, and the sweeper re-kicks its conversations); a prefetch of a few
kicks per slot, so kicks waiting for a slot wait in the process in the order they came
(:mod:`convoq.worker._fair`); the ``threads`` pool with many slots per process, because
turns wait on model calls; task events off by default (each costs a Redis PUBLISH per task
state): Flower turns them on in running workers itself (its ``enable_events`` broadcast),
and ``CONVOQ_TASK_EVENTS=true`` has them sent from the start, "task-sent" included. The
broker defaults to the memory Redis; an AMQP broker (RabbitMQ) works too, Redis still
holding memory.

``app`` is built on first access from ``ConvoqSettings`` (``CONVOQ_*``), so importing this
module starts nothing.
"""

from __future__ import annotations

from typing import Any

from celery import Celery, signals
from kombu import Exchange, Queue

from convoq._connection_bounds import ConnectionBounds
from convoq.queue import routing
from convoq.queue.transport import Broker, broker_for, celery_base_config
from convoq.redis.embedded import url_or_embedded
from convoq.settings import ConvoqSettings, fast_paths
from convoq.worker._fair import PREFETCH_MULTIPLIER
from convoq.worker._fair import enabled as own_line_on
from convoq.worker.runtime import WorkerRuntime, current_runtime, runtime_for
from convoq.worker.tasks import register_tasks


class ConvoqCelery(Celery):
    """A Celery app that knows the ConvoqSettings it was built from."""

    convoq_settings: ConvoqSettings

    def runtime(self) -> WorkerRuntime:
        """This process's runtime (event loop, protocol, runner), created on first use."""
        return runtime_for(self, self.convoq_settings)


def create_app(settings: ConvoqSettings | None = None) -> ConvoqCelery:
    """Build the worker app from ``settings`` (the environment when omitted)."""
    s = settings or ConvoqSettings()
    redis_url = url_or_embedded(s.redis_url, s.home)
    if s.redis_url is None:
        # Pool children and the runtime must reach the same embedded server.
        s = s.model_copy(update={"redis_url": redis_url})
    app = ConvoqCelery("convoq", set_as_current=False)
    app.convoq_settings = s
    broker = broker_for(redis_url, s.broker_url, ConnectionBounds.of(s))
    app.conf.update(worker_config(s, broker))
    register_tasks(app)
    return app


def worker_config(s: ConvoqSettings, broker: Broker | str) -> dict[str, Any]:
    """The Celery settings of a convoq worker (see the module docstring for why)."""
    queues = routing.queue_names(s.prefix, list(range(s.partitions)), s.pool)
    config = celery_base_config(
        broker, visibility_timeout_s=s.visibility_timeout_s, task_events=s.task_events
    )
    config.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        # With the fast paths off the process keeps no line of its own, so a kick it held
        # beyond its slots would be counted by nobody: waiting conversations stay in the
        # broker, where the fairness check (the broker's count) sees them.
        worker_prefetch_multiplier=PREFETCH_MULTIPLIER if own_line_on(s.fast_paths) else 1,
        worker_pool="threads",
        worker_concurrency=s.concurrency,
        worker_send_task_events=s.task_events,
        # Each queue on its own direct exchange, bound by its own name: what a client's
        # send_task(queue=name) declares, so Redis and AMQP route the same way.
        task_queues=[
            Queue(name, Exchange(name, type="direct"), routing_key=name) for name in queues
        ],
        task_default_queue=queues[0],
        broker_heartbeat=30,
    )
    if fast_paths(s.fast_paths):
        # kombu's Redis transport notes each delivered kick as unacked and clears the note
        # on the ack (8 commands a kick) so a kick of a dead worker comes back after the
        # visibility timeout. The sweeper re-kicks such a conversation sooner (lease TTL +
        # sweep period), and a kick is only a hint: the inbox holds the turn. A warm
        # shutdown still puts the kicks held back into their queues.
        options = {**config["broker_transport_options"], "ack_emulation": False}
        config["broker_transport_options"] = options
    return config


def _runtime_of(sender: Any) -> WorkerRuntime | None:
    app = getattr(sender, "app", None)
    if isinstance(app, ConvoqCelery):
        return app.runtime()
    return None


@signals.worker_ready.connect
def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    runtime = _runtime_of(sender)
    if runtime is not None:
        queues = sorted(q.name for q in sender.task_consumer.queues)
        runtime.use_pool(sender)
        runtime.announce(str(sender.hostname), queues)


@signals.worker_shutting_down.connect
def _on_worker_shutting_down(**_: Any) -> None:
    # Celery's warm shutdown waits for every running task without a bound; the runtime
    # bounds how long a turn keeps its task (finish within the grace, or hand it back).
    runtime = current_runtime()
    if runtime is not None:
        runtime.begin_shutdown()


@signals.worker_shutdown.connect
def _on_worker_shutdown(sender: Any = None, **_: Any) -> None:
    runtime = current_runtime()
    if runtime is not None and isinstance(getattr(sender, "app", None), ConvoqCelery):
        runtime.close()


_app: ConvoqCelery | None = None


def __getattr__(name: str) -> Any:
    # PEP 562: `celery -A convoq.worker.app:app` builds the app only when it is asked for.
    global _app
    if name == "app":
        if _app is None:
            _app = create_app()
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

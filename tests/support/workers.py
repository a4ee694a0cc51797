"""Real convoq worker processes for tests: spawn, wait until ready, stop, kill -9.

A worker is ``python -m convoq.cli worker`` (or ``python -m celery -A
convoq.worker.app:app worker``) with its settings in the environment. Readiness is the
entry the worker writes in Redis once its consumer runs (``KeySchema.workers``), not a sleep.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis

from convoq.client import Client
from convoq.queue.routing import queue_name
from convoq.redis.keys import KeySchema
from tests.support.redis_cluster import plain_client
from tests.support.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
AGENTS = "tests.support.worker_agents"
WEBHOOK_SECRET = "test-webhook-secret"
LOOPBACK = "127.0.0.0/8,::1"
_names = itertools.count()


def worker_env(redis_url: str, prefix: str, **settings: Any) -> dict[str, str]:
    """The environment of a worker: CONVOQ_* from ``settings`` over test defaults."""
    values: dict[str, Any] = {
        "redis_url": redis_url,
        "prefix": prefix,
        "agents": AGENTS,
        "partitions": 4,
        "concurrency": 8,
        "lease_ms": 5000,
        "sweep_interval_s": 1.0,
        "webhook_secret": WEBHOOK_SECRET,
        "webhook_retry_base_s": 0.2,
        # Webhook receivers in tests listen on loopback, which callbacks may not reach
        # unless allowed.
        "callback_allowed_networks": LOOPBACK,
        # The suite runs in both modes (`make test-slowpaths`): workers follow the tests'.
        "fast_paths": os.environ.get("CONVOQ_FAST_PATHS"),
    }
    values.update(settings)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOQ_")}
    env.update({f"CONVOQ_{k.upper()}": str(v) for k, v in values.items() if v is not None})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


class WorkerProcess:
    """One worker process; ``name`` is its Celery node name (``name@localhost``)."""

    def __init__(
        self,
        env: dict[str, str],
        log_dir: Path,
        *,
        partitions: str | None = None,
        use_celery_cli: bool = False,
    ) -> None:
        self.env = env
        self.name = f"w{next(_names)}-{uuid.uuid4().hex[:6]}@localhost"
        self.log_path = log_dir / f"{self.name.split('@')[0]}.log"
        self.partitions = partitions
        self.use_celery_cli = use_celery_cli
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        if self.use_celery_cli:
            return [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "convoq.worker.app:app",
                "worker",
                "--loglevel=info",
                f"--hostname={self.name}",
                "--without-mingle",
                "--without-gossip",
            ]
        cmd = [sys.executable, "-m", "convoq.cli", "worker", f"--hostname={self.name}"]
        if self.partitions:
            cmd.append(f"--partitions={self.partitions}")
        return cmd

    def start(self) -> WorkerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115  (the child keeps it open)
        self.process = subprocess.Popen(
            self.command(),
            env=self.env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, timeout: float = 45.0) -> WorkerProcess:
        """Block until the worker registered itself in Redis (its consumer is running)."""
        client = plain_client(self.env["CONVOQ_REDIS_URL"])
        key = KeySchema(self.env["CONVOQ_PREFIX"]).workers()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                try:
                    if client.hexists(key, self.name):
                        return self
                except (redis.ConnectionError, redis.TimeoutError):
                    pass  # a store slow to answer on a loaded machine: ask again
                if not self.alive():
                    raise RuntimeError(f"worker {self.name} exited:\n{self.log_tail()}")
                time.sleep(0.05)
        finally:
            client.close()
        raise RuntimeError(f"worker {self.name} not ready in {timeout}s:\n{self.log_tail()}")

    def kill(self) -> None:
        """kill -9: no shutdown, no acks, the lease left to expire."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait(10)

    def stop(self, timeout: float = 20.0) -> None:
        """Warm shutdown (SIGTERM), then kill -9 if it hangs."""
        if not self.alive():
            return
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class WorkerPool:
    """A prefix, its environment and the workers running with it."""

    def __init__(self, redis_url: str, log_dir: Path, **settings: Any) -> None:
        self.redis_url = redis_url
        self.prefix = f"w{uuid.uuid4().hex[:10]}"
        self.settings = settings
        self.env = worker_env(redis_url, self.prefix, **settings)
        self.log_dir = log_dir
        self.workers: list[WorkerProcess] = []

    @property
    def partitions(self) -> int:
        return int(self.env["CONVOQ_PARTITIONS"])

    def start(self, count: int = 1, **kwargs: Any) -> list[WorkerProcess]:
        """Start ``count`` workers at once and wait until all are ready."""
        started = [WorkerProcess(self.env, self.log_dir, **kwargs).start() for _ in range(count)]
        self.workers.extend(started)
        for worker in started:
            worker.wait_ready()
        return started

    def client(self, **kwargs: Any) -> Client:
        kwargs.setdefault(
            "callback_allowed_networks", self.env.get("CONVOQ_CALLBACK_ALLOWED_NETWORKS")
        )
        return Client(
            self.redis_url,
            broker_url=self.env.get("CONVOQ_BROKER_URL"),
            prefix=self.prefix,
            partitions=self.partitions,
            webhook_secret=WEBHOOK_SECRET,
            **kwargs,
        )

    def stop_all(self) -> None:
        for worker in self.workers:  # all at once, then wait for each
            if worker.alive() and worker.process is not None:
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers:
            worker.stop()
        self.workers.clear()

    def logs(self) -> str:
        return "\n\n".join(f"== {w.name}\n{w.log_tail()}" for w in self.workers)


@contextmanager
def supervised(
    pool: WorkerPool, on_exit: Callable[[WorkerProcess], None] | None = None
) -> Iterator[None]:
    """Restart any worker process of ``pool`` that exits (killed, or on its own), like a
    process supervisor; ``on_exit`` sees each exited worker before its restart."""
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.2):
            for worker in pool.workers:
                if not worker.alive():
                    if on_exit is not None:
                        on_exit(worker)
                    worker.start()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextmanager
def running_pool(
    redis_url: str, log_dir: Path, count: int, **settings: Any
) -> Iterator[WorkerPool]:
    """A pool of ``count`` ready workers, stopped on exit."""
    pool = WorkerPool(redis_url, log_dir, **settings)
    try:
        pool.start(count)
        yield pool
    finally:
        pool.stop_all()


def module_pool(count: int, **settings: Any) -> Any:
    """A module-scoped fixture: ``count`` ready workers with ``settings``, for every test
    of the module that asks for it (``pool = module_pool(3)``)."""

    @pytest.fixture(scope="module")
    def pool(
        redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[WorkerPool]:
        logs = tmp_path_factory.mktemp("workers")
        with running_pool(redis_server.url, logs, count, **settings) as started:
            yield started

    return pool


# path, the status it was answered with, headers, body
Post = tuple[str, int, dict[str, str], bytes]


class WebhookReceiver:
    """A local HTTP server (127.0.0.1) recording every POST it gets; paths in
    ``fail_first`` answer 500 to their first POST, so a retry must follow. Serve it with
    :func:`webhook_receiver`."""

    def __init__(self, fail_first: Collection[str] = ()) -> None:
        self.fail_first = set(fail_first)
        self.seen: list[Post] = []
        self._lock = threading.Lock()
        record = self._record

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                record(self)

            def log_message(self, *_: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _record(self, request: BaseHTTPRequestHandler) -> None:
        body = request.rfile.read(int(request.headers.get("Content-Length", 0)))
        with self._lock:
            earlier = [s for s in self.seen if s[0] == request.path]
            status = 500 if request.path in self.fail_first and not earlier else 200
            self.seen.append((request.path, status, dict(request.headers), body))
        request.send_response(status)
        request.end_headers()

    def posts(self, path: str) -> list[Post]:
        """The POSTs to ``path`` so far, in arrival order."""
        with self._lock:
            return [s for s in self.seen if s[0] == path]


@contextmanager
def webhook_receiver(fail_first: Collection[str] = ()) -> Iterator[WebhookReceiver]:
    """A :class:`WebhookReceiver` serving until the block ends."""
    receiver = WebhookReceiver(fail_first)
    server = receiver.server
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def broker_pushes(r: redis.Redis, pool: WorkerPool) -> Iterator[Callable[[], int]]:
    """Counts the messages published to ``pool``'s partition queues while the block runs
    (kombu's Redis transport LPUSHes each), from keyspace notifications of those keys
    alone: another pool's messages on this server (a killed worker's, restored by a
    consumer once their visibility timeout passed) do not count. The count is read once
    a marker published after them came back on the same subscription."""
    flags = r.config_get("notify-keyspace-events")["notify-keyspace-events"]
    r.config_set("notify-keyspace-events", "".join(sorted(set(flags) | {"K", "l"})))
    marker = f"{pool.prefix}:test:pushes-read"
    sub = r.pubsub()
    try:
        db = r.connection_pool.connection_kwargs.get("db", 0)
        partitions = range(pool.partitions)
        sub.psubscribe(*(f"__keyspace@{db}__:{queue_name(pool.prefix, p)}*" for p in partitions))
        sub.subscribe(marker)
        for _ in range(len(partitions) + 1):  # each subscription confirmed: listening now
            assert sub.get_message(timeout=10) is not None

        def count() -> int:
            r.publish(marker, "read")
            pushes, deadline = 0, time.monotonic() + 10
            while time.monotonic() < deadline:
                message = sub.get_message(timeout=1)
                if message is None:
                    continue
                if message["type"] == "message":
                    return pushes
                pushes += message["type"] == "pmessage" and message["data"] == b"lpush"
            raise AssertionError("the marker never came back")

        yield count
    finally:
        sub.close()
        r.config_set("notify-keyspace-events", flags)


def wait_until(
    predicate: Any, timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns something truthy (readiness, not timing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")

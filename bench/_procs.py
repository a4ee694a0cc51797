"""A system under measurement in a process of its own: the benchmark's process only sends
it requests and reads back figures.

In one process, every system's objects share one heap and one garbage collector (another
system's live objects decide when a full collection walks them all: a RedisSession load of
10,000 turns measured 59 ms in one run and 111 ms in another with only the set of systems
in the process changed), and every system's threads share one GIL. So each system's
client side (its reads, its submitters and waiters) runs in a child process of its own
(``multiprocessing``'s spawn: nothing inherited), built there by a factory named by its
import path; :class:`Remote` calls its methods by name and returns what they return."""

from __future__ import annotations

import importlib
import multiprocessing
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

_SPAWN = multiprocessing.get_context("spawn")


def _serve(conn: Connection, factory: str, args: tuple[Any, ...], path: list[str]) -> None:
    sys.path[:0] = [p for p in path if p not in sys.path]
    module, _, name = factory.rpartition(".")
    try:
        target = getattr(importlib.import_module(module), name)(*args)
        conn.send(("ready", None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        request = conn.recv()
        if request is None:
            break
        method, call_args = request
        try:
            conn.send(("ok", getattr(target, method)(*call_args)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
    close = getattr(target, "close", None)
    if close is not None:
        close()


class Remote:
    """``factory(*args)`` (an import path: ``"bench.compare_runs.ConvoqSide"``) built and
    kept in a child process; :meth:`call` runs one of its methods there."""

    def __init__(self, factory: str, *args: Any) -> None:
        self._conn, child = _SPAWN.Pipe()
        self._process = _SPAWN.Process(
            target=_serve, args=(child, factory, args, list(sys.path)), daemon=True
        )
        self._process.start()
        status, detail = self._conn.recv()
        if status != "ready":
            raise RuntimeError(f"{factory} did not start:\n{detail}")

    @property
    def pid(self) -> int:
        return int(self._process.pid or 0)

    def call(self, method: str, *args: Any) -> Any:
        self._conn.send((method, args))
        status, value = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"{method} failed in its process:\n{value}")
        return value

    def close(self) -> None:
        if self._process.is_alive():
            self._conn.send(None)
            self._process.join(30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(10)

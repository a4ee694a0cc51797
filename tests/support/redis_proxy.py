"""A loopback TCP proxy in front of the test redis-server that can lose one reply.

It forwards bytes both ways. Once armed with :meth:`LossyProxy.drop_reply_to`, the next
reply to a command containing that word (``EVALSHA``) is swallowed and both sides of that
connection are closed *after Redis ran the command*: exactly what a network failure
between Redis's answer and the client looks like, so redis-py reconnects and resends.
A ``-NOSCRIPT`` reply passes through (the client then loads the script and sends the
command again, which is still armed). :meth:`LossyProxy.hold_replies` keeps every reply
back until :meth:`LossyProxy.release_replies` (a slow network, for cancelling mid-read).
:attr:`LossyProxy.replied_bytes` counts the reply bytes it passed on (what a client read).

:meth:`LossyProxy.cut` takes the link down, as a network partition does, until
:meth:`LossyProxy.restore`: ``drop=False`` holds every byte both ways (commands do not
reach Redis, replies do not come back; new connections are accepted and held: what a
partition looks like to TCP, whose retransmits deliver once it heals); ``drop=True``
closes every connection and each new one at once (refused, as after a reset).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field


@dataclass
class _Link:
    client: socket.socket
    server: socket.socket
    awaiting: bool = False  # a command we must lose the reply of was forwarded
    closed: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class LossyProxy:
    """Forward 127.0.0.1:<port> to ``upstream_port``; lose replies on request."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self._upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._armed: bytes | None = None
        self._links: list[_Link] = []
        self.dropped = 0
        self.replied_bytes = 0
        self._flowing = threading.Event()
        self._flowing.set()
        self._link_up = threading.Event()  # cleared while the link is cut
        self._link_up.set()
        self._refusing = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def drop_reply_to(self, command: bytes) -> None:
        """Lose the reply of the next command containing ``command`` (once)."""
        with self._lock:
            self._armed = command.upper()

    def hold_replies(self) -> None:
        """Keep replies back (commands still reach Redis) until :meth:`release_replies`."""
        self._flowing.clear()

    def release_replies(self) -> None:
        self._flowing.set()

    def cut(self, *, drop: bool = False) -> None:
        """Take the link down until :meth:`restore` (see the module docstring)."""
        self._link_up.clear()
        if drop:
            with self._lock:
                self._refusing = True
                links, self._links = self._links, []
            for link in links:
                link.close()

    def restore(self) -> None:
        """Bring the link back: held bytes flow on, new connections are served."""
        with self._lock:
            self._refusing = False
        self._link_up.set()

    def close(self) -> None:
        self._flowing.set()
        self._link_up.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() that waits
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                refusing = self._refusing
            if refusing:
                _Link(client, client).close()
                continue
            server = socket.create_connection(self._upstream, timeout=5)
            server.settimeout(None)
            link = _Link(client, server)
            with self._lock:
                self._links.append(link)
            threading.Thread(target=self._upward, args=(link,), daemon=True).start()
            threading.Thread(target=self._downward, args=(link,), daemon=True).start()

    def _upward(self, link: _Link) -> None:
        """Client to Redis; notes a forwarded command whose reply is to be lost."""
        while not link.closed.is_set():
            data = _recv(link.client)
            if not data:
                break
            with self._lock:
                if self._armed is not None and self._armed in data.upper():
                    link.awaiting = True
            self._link_up.wait(timeout=120)
            if not _send(link.server, data):
                break
        link.close()

    def _downward(self, link: _Link) -> None:
        """Redis to client; swallows the awaited reply and cuts the connection."""
        while not link.closed.is_set():
            data = _recv(link.server)
            if not data:
                break
            self._flowing.wait(timeout=30)
            self._link_up.wait(timeout=120)
            with self._lock:
                lose = link.awaiting and not data.startswith(b"-NOSCRIPT")
                # After -NOSCRIPT comes SCRIPT LOAD, then the command again (armed still).
                link.awaiting = False
                if lose:
                    self._armed = None
                    self.dropped += 1
                else:
                    self.replied_bytes += len(data)
            if lose or not _send(link.client, data):
                break
        link.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _send(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
    except OSError:
        return False
    return True

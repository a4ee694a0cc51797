"""A loopback TCP forwarder whose connections can go half-open: :meth:`SilentProxy.silence`
makes every connection open now stop passing bytes either way without closing (what a
NAT or a firewall that forgot a connection, or a peer gone without a FIN, looks like to
TCP: writes succeed, nothing comes back) while new connections pass as before;
:meth:`SilentProxy.blackhole` makes new ones silent too (a partition: connects succeed,
then nothing), until :meth:`SilentProxy.restore`. Silenced connections stay open until
:meth:`SilentProxy.close`, so only a timeout on the client's side can notice them."""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field


@dataclass
class _Link:
    client: socket.socket
    server: socket.socket
    silent: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class SilentProxy:
    """Forward 127.0.0.1:<port> to ``upstream_port``; silence connections on request."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream = ("127.0.0.1", upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._blackhole = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, db: int = 0, query: str = "") -> str:
        return f"redis://127.0.0.1:{self.port}/{db}" + (f"?{query}" if query else "")

    def silence(self) -> int:
        """Every connection open now passes nothing more (they stay open); returns how many."""
        with self._lock:
            links = list(self._links)
        for link in links:
            link.silent.set()
        return len(links)

    def blackhole(self) -> None:
        """Silence every connection, and each new one from its first byte."""
        with self._lock:
            self._blackhole = True
        self.silence()

    def restore(self) -> None:
        """New connections pass again (silenced ones stay silent, as a forgotten NAT
        mapping does: the client has to notice and reconnect)."""
        with self._lock:
            self._blackhole = False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            link = _Link(client, server)
            with self._lock:
                self._links.append(link)
                if self._blackhole:
                    link.silent.set()
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(link, source, sink), daemon=True).start()

    @staticmethod
    def _pump(link: _Link, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if link.silent.is_set():
                    continue  # swallowed: the sender's write succeeded, no answer comes
                sink.sendall(data)
        except OSError:
            pass
        if not link.silent.is_set():
            link.close()  # a live link ends when either side closes

"""A TCP server on loopback that accepts connections and never answers: the worst Redis outage
for a client (a paused or wedged server, a black-holed network), where only the client's socket
timeout ends the wait. It counts what reaches it, so a test can say how often a client tried."""

from __future__ import annotations

import selectors
import socket
import threading
from types import TracebackType


class HungServer:
    """``with HungServer() as hung: url = hung.url`` — ``connections`` and ``bytes_received``
    say how often, and how much, clients sent."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._connections = 0
        self._bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="hung-server", daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def connections(self) -> int:
        with self._lock:
            return self._connections

    @property
    def bytes_received(self) -> int:
        with self._lock:
            return self._bytes

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        self._listener.setblocking(False)
        selector.register(self._listener, selectors.EVENT_READ)
        peers: list[socket.socket] = []
        try:
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=0.05):
                    sock = key.fileobj
                    if not isinstance(sock, socket.socket):
                        continue
                    if sock is self._listener:
                        peer, _ = self._listener.accept()
                        peer.setblocking(False)
                        peers.append(peer)
                        selector.register(peer, selectors.EVENT_READ)
                        with self._lock:
                            self._connections += 1
                        continue
                    try:
                        data = sock.recv(65536)
                    except OSError:
                        data = b""
                    if not data:  # the client gave up and closed
                        selector.unregister(sock)
                        sock.close()
                        continue
                    with self._lock:
                        self._bytes += len(data)
        finally:
            for peer in peers:
                peer.close()
            selector.close()

    def __enter__(self) -> HungServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()

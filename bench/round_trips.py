"""Counting Redis round trips: a loopback TCP proxy in front of the bench's redis-server.

Every connection through it is forwarded byte for byte; a round trip is counted each time a client
sends after it has had an answer (a pipeline is one round trip, as on the wire), and named by the
commands it carries (``EVALSHA`` by the script whose SHA it names). Used for a counting run apart
from the timed ones: the proxy's own latency must not be part of a throughput figure.
"""

from __future__ import annotations

import hashlib
import selectors
import socket
import threading
from collections import Counter
from collections.abc import Iterable


def script_names(sources: Iterable[tuple[str, str]]) -> dict[str, str]:
    """SHA1 → name of each ``(name, source)``: how EVALSHA calls are labelled."""
    return {hashlib.sha1(text.encode("utf-8")).hexdigest(): name for name, text in sources}


def _commands(data: bytes) -> list[list[bytes]]:
    """The complete RESP commands in ``data`` (arrays of bulk strings), the first two words of
    each; an incomplete tail is ignored (it is counted with the round trip that started it)."""
    out: list[list[bytes]] = []
    at = 0
    while at < len(data) and data[at : at + 1] == b"*":
        end = data.find(b"\r\n", at)
        if end < 0:
            break
        count = int(data[at + 1 : end])
        at = end + 2
        words: list[bytes] = []
        for _ in range(count):
            end = data.find(b"\r\n", at)
            if end < 0 or data[at : at + 1] != b"$":
                return out
            size = int(data[at + 1 : end])
            start = end + 2
            if len(words) < 2:
                words.append(data[start : start + size])
            at = start + size + 2
        out.append(words)
    return out


class CountingProxy:
    """``with CountingProxy(port, names) as proxy:`` → ``proxy.url``; ``proxy.counts`` by label."""

    def __init__(self, target_port: int, scripts: dict[str, str] | None = None) -> None:
        self._target = ("127.0.0.1", target_port)
        self._scripts = scripts or {}
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.round_trips = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="redis-counter", daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]

    def snapshot(self) -> tuple[int, Counter[str]]:
        with self._lock:
            return self.round_trips, Counter(self.counts)

    def _label(self, words: list[bytes]) -> str:
        name = words[0].decode("ascii", "replace").upper() if words else "?"
        if name in ("EVALSHA", "EVAL") and len(words) > 1:
            sha = words[1].decode("ascii", "replace")
            return f"script {self._scripts.get(sha, sha[:8])}"
        return name

    def _loop(self) -> None:
        # Per connection: its peer socket, whether it is the client side, and (client side)
        # whether the server answered since the client last sent.
        peers: dict[socket.socket, socket.socket] = {}
        answered: dict[socket.socket, bool] = {}
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                sock = key.fileobj
                if sock is self._listener:
                    client, _ = self._listener.accept()
                    server = socket.create_connection(self._target)
                    for s in (client, server):
                        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    peers[client], peers[server] = server, client
                    answered[client] = True
                    self._selector.register(client, selectors.EVENT_READ, "client")
                    self._selector.register(server, selectors.EVENT_READ, "server")
                    continue
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(1 << 20)
                except OSError:
                    data = b""
                peer = peers.get(sock)
                if not data or peer is None:
                    for gone in (sock, peer):
                        if gone is not None:
                            self._selector.unregister(gone)
                            gone.close()
                            peers.pop(gone, None)
                            answered.pop(gone, None)
                    continue
                if key.data == "client":
                    if answered.get(sock, True):
                        answered[sock] = False
                        labels = [self._label(words) for words in _commands(data)]
                        with self._lock:
                            self.round_trips += 1
                            self.counts[" + ".join(sorted(set(labels))) or "?"] += 1
                else:
                    answered[peer] = True
                peer.sendall(data)

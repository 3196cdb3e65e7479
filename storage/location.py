"""Where memory documents are stored, as the workers publish it in Redis and readers compare it.

Workers write documents, agents and operators read them: with file storage a reader whose folder
differs from the workers' (another ``MEMQ_STORAGE_DIR``, a default folder relative to another
working directory, a host's own disk) reads nothing and memory just looks empty. Each worker
publishes its place at start (one Redis key of its prefix); the injector, the DeerFlow backend
and ``memq doctor`` compare it with their own and say so in one line.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings

if TYPE_CHECKING:
    from memq.core.connection import RedisClient

log = logging.getLogger("memq.storage")

# A reader checks once per process and place: the check must not become a per-turn round trip.
_checked: set[tuple[str, str, str, str]] = set()
_checked_lock = threading.Lock()
_CHECK_TIMEOUT_SECONDS = 0.5
_MAX_SHOWN = 300  # characters of a folder or host name in a message


@dataclass(frozen=True, slots=True)
class StorageLocation:
    """A storage backend and, for files, the absolute folder (and the host whose disk it is)."""

    backend: Literal["file", "redis"]
    folder: str = ""
    host: str = ""

    def same_place(self, other: StorageLocation) -> bool:
        # Hosts are not compared: containers sharing one volume have different host names.
        return self.backend == other.backend and self.folder == other.folder

    def describe(self) -> str:
        if self.backend == "redis":
            return "Redis storage"
        host = f" (host {_shown(self.host)})" if self.host else ""
        return f"file storage in {_shown(self.folder)}{host}"


def _shown(text: str) -> str:
    """Text read back from Redis as it may be printed to an operator: control and format
    characters escaped (an ``ESC[2K`` in a folder name must not rewrite the terminal), capped."""
    out = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text[:_MAX_SHOWN])
    return out + ("…" if len(text) > _MAX_SHOWN else "")


def location_of(settings: MemqSettings) -> StorageLocation:
    """This process's place, from its settings."""
    if settings.storage == "redis":
        return StorageLocation("redis", host=socket.gethostname())
    return StorageLocation(
        "file", folder=str(settings.storage_dir.expanduser().resolve()), host=socket.gethostname()
    )


def publish(client: RedisClient, settings: MemqSettings) -> StorageLocation:
    """Record this (worker) process's place under the prefix; the last worker started wins."""
    here = location_of(settings)
    value = {"backend": here.backend, "folder": here.folder, "host": here.host}
    client.set(
        KeySchema(settings.key_prefix, settings.shards).storage_location(), json.dumps(value)
    )
    return here


def published(client: RedisClient, settings: MemqSettings) -> StorageLocation | None:
    """The workers' place, or None when no worker of this prefix has published one (or it is
    not one this version reads)."""
    raw = client.get(KeySchema(settings.key_prefix, settings.shards).storage_location())
    if not raw:
        return None
    try:
        data = json.loads(raw)
        backend = data["backend"]
        if backend not in ("file", "redis"):
            return None
        return StorageLocation(backend, str(data.get("folder", "")), str(data.get("host", "")))
    except (ValueError, TypeError, KeyError):
        return None


def mismatch(reader: StorageLocation, workers: StorageLocation | None) -> str | None:
    """One line when the reader looks somewhere else than the workers store; None otherwise."""
    if workers is None or reader.same_place(workers):
        return None
    return (
        f"memq: workers store memory in {workers.describe()}, but this process reads "
        f"{reader.describe()}: memory will look empty here. Give both the same MEMQ_STORAGE "
        "and MEMQ_STORAGE_DIR."
    )


def check_reader(
    settings: MemqSettings, reader: str, client: RedisClient | None = None
) -> str | None:
    """Compare this reader's place with the workers' once per process; log the line (WARNING)
    and return it. Never raises: a reader must work even when the check cannot run."""
    here = location_of(settings)
    key = _check_key(settings)
    with _checked_lock:
        if key in _checked:
            return None
        _checked.add(key)
    own = client is None
    try:
        if client is None:
            from memq.core.connection import redis_client

            client = redis_client(settings, socket_timeout=_CHECK_TIMEOUT_SECONDS)
        line = mismatch(here, published(client, settings))
    except Exception as exc:  # the check is advice; the read itself reports its own failures
        log.debug("memq: storage location check skipped for %s: %s", reader, type(exc).__name__)
        return None
    finally:
        if own and client is not None:
            client.close()
    if line:
        log.warning("%s (%s)", line, reader)
    return line


def check_reader_soon(
    settings: MemqSettings | None, reader: str, client: RedisClient | None = None
) -> None:
    """:func:`check_reader` on a daemon thread, once per process and place: for readers on an
    agent's path (called after a read that worked), whose turn must not wait for the check's
    round trip. Cheap when already checked: a set lookup."""
    if settings is None:
        return
    with _checked_lock:
        if _check_key(settings) in _checked:
            return
    threading.Thread(
        target=check_reader,
        args=(settings, reader, client),
        name="memq-location-check",
        daemon=True,
    ).start()


def _check_key(settings: MemqSettings) -> tuple[str, str, str, str]:
    # From the settings alone (no file-system call): this runs on every read.
    return (settings.redis_url, settings.key_prefix, settings.storage, str(settings.storage_dir))


def forget_checks() -> None:
    """Forget which places were checked (tests that change a place within one process)."""
    with _checked_lock:
        _checked.clear()
